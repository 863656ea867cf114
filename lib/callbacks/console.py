"""What a run shows on the console by default: the ``taskfit`` logger's own handler (the start summary, the
resume message, warnings) and one line per logged dict (mirrors HF's ``PrinterCallback``: ``{'loss': ...}``).

Only the main process speaks: the handler's level is ``log_level`` there (``"passive"`` means ``info``) and
``log_level_replica`` (default ``warning``) on the other ranks; the printer prints on global rank 0 only.
When the application configured Python logging itself (the root logger has a handler, e.g. after
``logging.basicConfig``), taskfit's records go to that handler instead, so nothing is printed twice.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

log = logging.getLogger("taskfit")


class _DefaultHandler(logging.StreamHandler):
    """stderr handler of the ``taskfit`` logger, silent while the root logger has handlers of its own."""

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:  # the application set up logging: its handlers print the record
            return
        self.stream = sys.stderr  # follow a replaced sys.stderr (pytest's capture, notebooks)
        super().emit(record)


def configure_console(args: Any, strategy: Any) -> str:
    """Give the ``taskfit`` logger a stderr handler (once per process) and set its level for this process; a
    ``log_level`` other than ``"passive"`` also sets the ``transformers`` logger's level (mirrors HF
    ``Trainer.__init__``'s ``logging.set_verbosity(args.get_process_log_level())``).

    Args:
        args (FitArguments): ``log_level``, ``log_level_replica``, ``log_on_each_node``.
        strategy (Strategy): ``is_global_zero`` / ``local_rank`` decide main or replica.

    Returns:
        str: the level set (``"INFO"``, ``"WARNING"``, ...).
    """
    main = strategy.is_global_zero or (bool(args.log_on_each_node) and strategy.local_rank == 0)
    level = args.log_level if main else args.log_level_replica
    level = ("INFO" if main else "WARNING") if level in (None, "passive") else level.upper()
    if not any(isinstance(h, _DefaultHandler) for h in log.handlers):
        handler = _DefaultHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
    log.setLevel(level)
    named = args.log_level if main else args.log_level_replica
    if named not in (None, "passive"):  # HF's Trainer sets the `transformers` logger's verbosity the same way
        logging.getLogger("transformers").setLevel(named.upper())
    return level


def format_logs(logs: dict[str, Any]) -> str:
    """One line for a logged dict, as the HF Trainer prints it: ``{'loss': 0.6931, 'epoch': 0.5}`` (floats
    with 4 significant digits, ``total_flos`` left out)."""
    shown = {k: (float(f"{v:.4g}") if isinstance(v, float) else v) for k, v in logs.items() if k != "total_flos"}
    return str(shown)


class LogPrinter:
    """Print every logged dict as one line on global rank 0 (the console view when the progress bar is off;
    mirrors HF's ``PrinterCallback``). A plain HF-style callback object: it has no state, so checkpoints hold
    nothing for it."""

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if logs and state.is_world_process_zero:
            print(format_logs(logs), flush=True)
