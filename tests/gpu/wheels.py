"""The wheels the GPU machine lacks (it has no network): ``download`` fills a folder here, ``install`` installs on
the device the ones whose distribution is missing there.

``python tests/gpu/wheels.py download DIR`` (run with network, ``make gpu-wheels``): wheels for CPython 3.12 on
manylinux x86_64 (the device's Python), without dependencies, of every package in :data:`REQUIRED` (DeepSpeed is an
sdist on PyPI: it is built here into a pure-Python wheel with ``DS_BUILD_OPS=0``, its ops compile just in time on
the device), then each package of :data:`OPTIONAL` only while the folder stays within :data:`BUDGET_BYTES`.
Writes ``DIR/manifest.json`` (``{"wheels": [...], "optional": {name: "included" | reason}, "bytes": N}``).

``python tests/gpu/wheels.py install DIR``: ``pip install --no-deps --no-index`` of the wheels in ``DIR`` whose
distribution is not installed (an installed one is never replaced, so the image's torch stack stays as it is).
"""

from __future__ import annotations

import glob
import importlib.metadata as md
import json
import os
import re
import subprocess
import sys

#: DeepSpeed and its small dependencies (those already in the device image are skipped by ``install``);
#: setuptools and wheel let pip build taskfit itself offline when the image's own are too old
REQUIRED = ("hjson", "ninja", "py-cpuinfo", "msgpack", "einops", "psutil", "pydantic", "pydantic-core",
            "annotated-types", "typing-inspection", "setuptools", "wheel")
SDISTS = ("deepspeed",)
#: CUDA packages taken only if they fit (largest last)
OPTIONAL = ("torchao", "bitsandbytes")
#: what the device call carries in all (the working tree travels too: leave it ~6 MiB)
BUDGET_BYTES = 58 * 2**20
PLATFORM_ARGS = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
                 *[a for p in ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_24_x86_64",
                               "manylinux_2_28_x86_64") for a in ("--platform", p)], "--no-deps"]


def _pip(*args: str, env: dict | None = None) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True, env=env)


def _size(folder: str) -> int:
    return sum(os.path.getsize(p) for p in glob.glob(os.path.join(folder, "*.whl")))


def download(folder: str) -> dict:
    """Fill ``folder`` (created) and return the manifest written to ``folder/manifest.json``.

    Raises:
        subprocess.CalledProcessError: a required download or the DeepSpeed build failed.
    """
    os.makedirs(folder, exist_ok=True)
    _pip("download", "-q", *PLATFORM_ARGS, "-d", folder, *REQUIRED)
    sdist_dir = os.path.join(folder, "sdist")
    _pip("download", "-q", "--no-binary=:all:", "--no-deps", "-d", sdist_dir, *SDISTS)
    env = {**os.environ, "DS_BUILD_OPS": "0"}  # pure Python: the ops are compiled on first use on the device
    for sdist in glob.glob(os.path.join(sdist_dir, "*.tar.gz")):
        _pip("wheel", "-q", "--no-deps", "--no-build-isolation", "-w", folder, sdist, env=env)
        os.remove(sdist)
    optional: dict[str, str] = {}
    for name in OPTIONAL:
        trial = os.path.join(folder, "trial")
        _pip("download", "-q", *PLATFORM_ARGS, "-d", trial, name)
        wheel = glob.glob(os.path.join(trial, "*.whl"))[0]
        total = _size(folder) + os.path.getsize(wheel)
        if total <= BUDGET_BYTES:
            os.replace(wheel, os.path.join(folder, os.path.basename(wheel)))
            optional[name] = "included"
        else:
            optional[name] = f"left out: {total / 2**20:.1f} MiB with it, over the {BUDGET_BYTES / 2**20:.0f} MiB budget"
            os.remove(wheel)
        os.rmdir(trial)
    for leftover in (sdist_dir,):
        if os.path.isdir(leftover) and not os.listdir(leftover):
            os.rmdir(leftover)
    manifest = {"wheels": sorted(os.path.basename(p) for p in glob.glob(os.path.join(folder, "*.whl"))),
                "optional": optional, "bytes": _size(folder)}
    with open(os.path.join(folder, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest


def _dist_name(wheel: str) -> str:
    return re.split(r"-\d", os.path.basename(wheel), maxsplit=1)[0].replace("_", "-").lower()


def missing_wheels(folder: str) -> list[str]:
    """The wheels in ``folder`` whose distribution is not installed in this Python."""
    out = []
    for wheel in sorted(glob.glob(os.path.join(folder, "*.whl"))):
        try:
            md.version(_dist_name(wheel))
        except md.PackageNotFoundError:
            out.append(wheel)
    return out


def install(folder: str) -> list[str]:
    """Install the missing wheels of ``folder`` offline, without dependencies; returns their file names."""
    wheels = missing_wheels(folder)
    if wheels:
        _pip("install", "-q", "--no-deps", "--no-index", *wheels)
    return [os.path.basename(w) for w in wheels]


if __name__ == "__main__":
    command, target = sys.argv[1], sys.argv[2]
    if command == "download":
        m = download(target)
        print(f"{target}: {len(m['wheels'])} wheels, {m['bytes'] / 2**20:.1f} MiB; optional: {m['optional']}")
    else:
        print("installed:", ", ".join(install(target)) or "nothing (all present)")
