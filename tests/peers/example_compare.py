"""How ``run_hf_examples.py`` compares two ``output_dir`` folders that one example script wrote, once under
transformers and once under ``taskfit.hf``: one check per file present on either side, per number of the JSON
files (timings excepted), per weight file.

A check is ``(id, same, detail)``: ``id`` names the file and, for JSON, the key path (``eval_results.json:eval_loss``,
``trainer_state.json:log_history[3].loss``); ``detail`` says what differs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

Check = tuple[str, bool, str]

#: keys whose values are wall-clock measurements (seconds, rates): compared for presence, not value
TIMING_SUFFIXES = ("_runtime", "_per_second")
#: the relative tolerance of keys that are means over an evaluation set: transformers averages each batch's float32
#: mean repeated batch-size times, taskfit sums loss x batch size over the samples (a documented difference of
#: summation order, the last digits only); every other number must be bitwise equal
EVAL_MEAN_RTOL = {"eval_loss": 1e-6, "perplexity": 1e-6, "predict_loss": 1e-6, "test_loss": 1e-6}


def is_timing(key: str) -> bool:
    """True for a wall-clock key (``train_runtime``, ``eval_samples_per_second``, ...)."""
    return key.endswith(TIMING_SUFFIXES)


def numbers_equal(a: float, b: float, rtol: float) -> bool:
    """``a == b`` (``rtol == 0``) or ``|a - b| <= rtol * max(|a|, |b|)``; two NaNs are equal."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b if rtol == 0 else abs(a - b) <= rtol * max(abs(a), abs(b))


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def compare_json(prefix: str, hf: Any, tf: Any, rtol: float) -> list[Check]:
    """Checks of two parsed JSON values: one per leaf (numbers within ``rtol``, anything else equal), timing keys
    for presence only, a missing key on either side as a difference.

    Args:
        prefix (str): the id of the value (``"eval_results.json"``); leaves add ``:key``, ``.key`` and ``[i]``.
        hf, tf: the parsed values (transformers' and taskfit's).
        rtol (float): relative tolerance for numbers (0: exact).

    Returns:
        list[Check]: in key order.
    """
    if isinstance(hf, dict) and isinstance(tf, dict):
        sep = ":" if prefix.endswith(".json") else "."
        out: list[Check] = []
        for key in sorted(set(hf) | set(tf), key=str):
            kid = f"{prefix}{sep}{key}"
            if key not in tf or key not in hf:
                out.append((kid, False, f"only under {'HF' if key in hf else 'taskfit'}"))
            elif is_timing(str(key)):
                out.append((kid, True, "timing"))
            else:
                out += compare_json(kid, hf[key], tf[key], max(rtol, EVAL_MEAN_RTOL.get(str(key), 0.0)))
        return out
    if isinstance(hf, list) and isinstance(tf, list):
        if len(hf) != len(tf):
            return [(f"{prefix}[len]", False, f"HF {len(hf)} items, taskfit {len(tf)}")]
        return [c for i, (a, b) in enumerate(zip(hf, tf)) for c in compare_json(f"{prefix}[{i}]", a, b, rtol)]
    if _is_number(hf) and _is_number(tf):
        same = numbers_equal(hf, tf, rtol)
        return [(prefix, same, "" if same else f"HF {hf!r}, taskfit {tf!r} (diff {tf - hf:.3g})")]
    return [(prefix, hf == tf, "" if hf == tf else f"HF {hf!r}, taskfit {tf!r}")]


def compare_safetensors(rel: str, hf: Path, tf: Path, rtol: float) -> Check:
    """One check of two ``.safetensors`` files: same tensor names, shapes, dtypes and values (within ``rtol``)."""
    import torch
    from safetensors.torch import load_file

    a, b = load_file(str(hf)), load_file(str(tf))
    if set(a) != set(b):
        return (rel, False, (f"tensor names differ: HF only {sorted(set(a) - set(b))[:3]}, "
                             f"taskfit only {sorted(set(b) - set(a))[:3]}"))
    worst, name = 0.0, ""  # the largest |diff| relative to the tensor's largest |value|
    for key in sorted(a):
        if a[key].shape != b[key].shape or a[key].dtype != b[key].dtype:
            return (rel, False, (f"{key}: HF {tuple(a[key].shape)} {a[key].dtype}, "
                                 f"taskfit {tuple(b[key].shape)} {b[key].dtype}"))
        if a[key].numel() == 0 or torch.equal(a[key], b[key]):
            continue
        x, y = a[key].double(), b[key].double()
        ratio = ((x - y).abs().max() / x.abs().max().clamp_min(1e-30)).item()
        if ratio > worst:
            worst, name = ratio, key
    same = worst <= rtol if rtol else worst == 0.0
    return (rel, same, "" if same else f"{name}: max |diff| / max |value| = {worst:.3g}")


def list_files(root: Path) -> set[str]:
    """Relative paths (``/``-separated) of the files under ``root``; empty when it does not exist."""
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()} if root.is_dir() else set()


def compare_file(rel: str, hf: Path, tf: Path, rtol: float) -> list[Check]:
    """Checks of one file both sides wrote: JSON by value, safetensors by tensor, text by content; other files
    (pickled optimizer/RNG state, binary) by presence only."""
    if rel.endswith(".json"):
        try:
            a, b = json.loads(hf.read_text(encoding="utf-8")), json.loads(tf.read_text(encoding="utf-8"))
        except ValueError as e:
            return [(rel, False, f"not JSON: {e}")]
        return compare_json(rel, a, b, rtol)
    if rel.endswith(".safetensors"):
        return [compare_safetensors(rel, hf, tf, rtol)]
    if rel.endswith((".txt", ".csv")):
        same = hf.read_bytes() == tf.read_bytes()
        return [(rel, same, "" if same else "contents differ")]
    return [(rel, True, "present on both sides")]


def compare_outputs(hf_dir: Path, tf_dir: Path, rtol: float) -> list[Check]:
    """Every check of two ``output_dir`` folders: a file on one side only is a difference; files on both sides by
    :func:`compare_file`. The model card (``README.md``) is compared for presence (it holds versions and dates).

    Args:
        hf_dir, tf_dir (Path): the folders written under transformers and under taskfit.
        rtol (float): relative tolerance for numbers and weights (0: bitwise).

    Returns:
        list[Check]: sorted by file.
    """
    a, b = list_files(hf_dir), list_files(tf_dir)
    out: list[Check] = []
    for rel in sorted(a | b):
        if rel not in a or rel not in b:
            out.append((f"file {rel}", False, f"written under {'HF' if rel in a else 'taskfit'} only"))
        elif rel.endswith("README.md"):
            out.append((f"file {rel}", True, "present on both sides"))
        else:
            out += compare_file(rel, hf_dir / rel, tf_dir / rel, rtol)
    return out
