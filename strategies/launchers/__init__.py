"""Launchers: how taskfit starts the processes of a run when no external launcher did."""

from taskfit.strategies.launchers.multiprocessing import MultiprocessingLauncher
from taskfit.strategies.launchers.subprocess_script import SubprocessScriptLauncher, script_command, start_worker

__all__ = ["MultiprocessingLauncher", "SubprocessScriptLauncher", "script_command", "start_worker"]
