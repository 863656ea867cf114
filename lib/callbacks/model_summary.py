"""The layer table printed at the start of fit (mirrors Lightning's ``ModelSummary`` callback)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from taskfit.callbacks.base import Callback
from taskfit.core.hooks import module_modes


def _fmt(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return str(n)


def _shape(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return list(x.shape)
    if isinstance(x, (list, tuple)):
        return [_shape(v) for v in x]
    return "?"


def summarize(module: nn.Module, max_depth: int = 1) -> list[dict[str, Any]]:
    """One row per submodule up to ``max_depth`` levels deep: ``name``, ``type``, ``params`` (count), ``mode``
    (``"train"``/``"eval"``) and, when the module has ``example_input_array``, ``in_shape``/``out_shape`` from one
    forward pass without gradients (the module's training mode is kept).

    Raises:
        ValueError: ``max_depth`` < -1 (-1 = every level).
    """
    if not isinstance(max_depth, int) or max_depth < -1:
        raise ValueError(f"ModelSummary max_depth={max_depth!r} must be an int >= -1 (-1 = every level).")
    rows, mods = [], []
    for name, mod in module.named_modules():
        depth = name.count(".") + 1
        if not name or (max_depth != -1 and depth > max_depth):
            continue
        mods.append(mod)
        rows.append({"name": name, "type": type(mod).__name__, "params": sum(p.numel() for p in mod.parameters()),
                     "mode": "train" if mod.training else "eval"})
    example = getattr(module, "example_input_array", None)
    if example is not None and rows:
        shapes: dict[int, tuple[Any, Any]] = {}
        hooks = [m.register_forward_hook(lambda m, i, o, k=k: shapes.__setitem__(k, (_shape(i), _shape(o))))
                 for k, m in enumerate(mods)]
        restore_modes = module_modes(module)
        try:
            module.eval()
            with torch.no_grad():
                module(*example) if isinstance(example, tuple) else module(example)
        finally:
            restore_modes()  # each submodule's own mode (a frozen one stays in eval)
            for h in hooks:
                h.remove()
        for k, row in enumerate(rows):
            ins, outs = shapes.get(k, ("?", "?"))
            row["in_shape"] = ins[0] if isinstance(ins, list) and len(ins) == 1 else ins
            row["out_shape"] = outs
    return rows


class ModelSummary(Callback):
    """Print the layer table of the module at the start of fit, on the main process.

    Args:
        max_depth (int): levels of submodules shown (1 = direct children; -1 = all; 0 = no table).

    Attributes:
        rows (list[dict]): the table of the last fit (see :func:`summarize`); also the totals
            ``total_params``, ``trainable_params``.
    """

    def __init__(self, max_depth: int = 1) -> None:
        if not isinstance(max_depth, int) or max_depth < -1:
            raise ValueError(f"ModelSummary max_depth={max_depth!r} must be an int >= -1 (-1 = every level).")
        self.max_depth = max_depth
        self.rows: list[dict[str, Any]] = []
        self.total_params = self.trainable_params = 0

    def on_fit_start(self, fit: Any, module: Any) -> None:
        if not self.max_depth:
            return
        model = fit.run.model if fit.run is not None else module
        self.rows = summarize(model, self.max_depth)
        self.total_params = sum(p.numel() for p in model.parameters())
        self.trainable_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
        if fit.is_global_zero:
            print(self.table())

    def table(self) -> str:
        """The rows as a text table with totals."""
        cols = ["name", "type", "params", "mode"] + (["in_shape", "out_shape"] if self.rows and "in_shape" in
                                                     self.rows[0] else [])
        body = [[""] + cols] + [[str(i)] + [_fmt(r[c]) if c == "params" else str(r[c]) for c in cols]
                                for i, r in enumerate(self.rows)]
        widths = [max(len(row[j]) for row in body) for j in range(len(body[0]))]
        lines = [" | ".join(v.ljust(w) for v, w in zip(row, widths)) for row in body]
        lines.insert(1, "-" * len(lines[0]))
        lines += ["-" * len(lines[0]), f"{_fmt(self.trainable_params)}  Trainable params",
                  f"{_fmt(self.total_params - self.trainable_params)}  Non-trainable params",
                  f"{_fmt(self.total_params)}  Total params"]
        return "\n".join(lines)
