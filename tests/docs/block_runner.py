"""Runs documentation blocks as scripts, each in its own process forked from one that imported torch and taskfit
already: ``python block_runner.py`` reads one JSON request a line on stdin, ``{"script", "cwd", "stdout",
"stderr"}``, and answers each with ``{"rc": exit code}`` once that script's process has ended.

Why: a fresh interpreter spends about 2.3 CPU-s importing torch and taskfit before a block's first line, twenty
times per run of the docs tests. A forked child is a process of its own (its own working folder, output files,
``sys.argv``, ``__main__``, exit code, interpreter shutdown with atexit handlers and thread joins) that starts with
those modules loaded, as a fresh interpreter would after its imports. This parent computes nothing, so no thread
pool exists yet to be lost in the fork. The environment is the one this process was started with.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import traceback

import taskfit  # noqa: F401  (loaded once here, inherited by every child)
import torch
from taskfit import Fit, FitArguments, TaskModule  # noqa: F401


def _child(request: dict) -> None:
    """In the forked child: the block's files, folder and argv, then the script as ``__main__``; ends the process
    with the script's exit code through a normal interpreter shutdown."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    os.chdir(request["cwd"])
    script = request["script"]
    sys.argv = [script]
    sys.path[0] = os.path.dirname(script)  # what ``python script.py`` puts first
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if not isinstance(stop.code, (int, type(None))):
            print(stop.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001  (reported as Python reports an uncaught exception)
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    raise SystemExit(code)  # unwinds out of main(): the interpreter shuts down as after a script


def main() -> None:
    torch.set_num_threads(1)
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            _child(request)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    main()
