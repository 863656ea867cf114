"""``python tests/packaging/install.py PIP_INSTALL_ARGS...``: install into this interpreter's environment with
``uv pip install`` when uv is there (next to this interpreter or on PATH), else with ``python -m pip install``;
the Makefile's set-up goes through it.

uv resolves and installs the test stack several times faster than pip, but it reads none of pip's
configuration: the indexes, find-links, constraints, certificate and timeout that pip would use here (its config
files and ``PIP_*`` variables, as ``pip config list`` shows them, ``:env:`` over ``install`` over ``global``) are
handed to uv, and uv picks the best version across all of them as pip does (``--index-strategy
unsafe-best-match``), so both install the same packages. Exits with the installer's exit code.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys

# pip option -> uv option; values that pip separates by spaces are passed one by one
_OPTIONS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
            "constraint": "--constraint"}
_PRECEDENCE = {"global": 0, "install": 1, ":env:": 2}  # pip's own override order


def pip_settings(python: str = sys.executable) -> dict[str, str]:
    """pip's effective settings for ``pip install`` (``{"find-links": "/opt/wheels", ...}``), read from ``pip config
    list`` (which prints ``section.key='value'`` lines); an unreadable configuration gives ``{}``."""
    proc = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False)
    found: dict[str, tuple[int, str]] = {}
    for line in proc.stdout.splitlines():
        key, sep, value = line.partition("=")
        section, _, name = key.rpartition(".")
        if not sep or section not in _PRECEDENCE:
            continue
        try:
            value = str(ast.literal_eval(value))
        except (ValueError, SyntaxError):
            continue
        rank = _PRECEDENCE[section]
        if rank >= found.get(name, (-1, ""))[0]:
            found[name] = (rank, value)
    return {name: value for name, (_, value) in found.items()}


def uv_command(uv: str, args: list[str], settings: dict[str, str], python: str = sys.executable
               ) -> tuple[list[str], dict[str, str]]:
    """The ``uv pip install`` command line and environment that install ``args`` (pip's install arguments) into
    the environment of ``python`` (an interpreter's path) from the places that ``settings`` (``pip_settings()``)
    name."""
    cmd = [uv, "pip", "install", "--python", python, "--index-strategy", "unsafe-best-match"]
    for name, option in _OPTIONS.items():
        for value in settings.get(name, "").split():
            cmd += [option, value]
    env = dict(os.environ)
    if settings.get("cert"):
        env.setdefault("SSL_CERT_FILE", settings["cert"])
    if settings.get("default-timeout") or settings.get("timeout"):
        env.setdefault("UV_HTTP_TIMEOUT", settings.get("timeout") or settings["default-timeout"])
    return cmd + args, env


def find_uv() -> str | None:
    """uv next to this interpreter (installed into the venv), else on PATH, else None."""
    local = os.path.join(os.path.dirname(sys.executable), "uv")
    return local if os.access(local, os.X_OK) else shutil.which("uv")


def main(args: list[str]) -> int:
    uv = find_uv()
    if uv is None:
        return subprocess.call([sys.executable, "-m", "pip", "install", *args])
    # --compile-bytecode: pip writes the .pyc files at install time, uv only when asked; without them every
    # first import in the test run would compile (and race to write) them
    cmd, env = uv_command(uv, ["--compile-bytecode", *args], pip_settings())
    code = subprocess.call(cmd, env=env)
    if code != 0:  # a resolution or index pip handles and uv does not must not stop the set-up
        print(f"uv pip install exited with {code}: installing with pip instead", file=sys.stderr)
        code = subprocess.call([sys.executable, "-m", "pip", "install", *args])
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
