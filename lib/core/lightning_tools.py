"""The ``LightningModule`` members about the process and the finished model, on every ``TaskModule``: the ranks
(``global_rank``, ``local_rank``), ``all_gather``, ``freeze``/``unfreeze``, ``to_torchscript``, ``to_onnx``, and
the ``fabric`` reference Lightning Fabric sets when it runs the module."""

from __future__ import annotations

import importlib.util
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
from lightning_utilities.core.apply_func import apply_to_collection

#: ``torch.jit.script`` compiles every property of a module unless listed here (Lightning's list, and ours).
JIT_UNUSED_PROPERTIES = [
    "example_input_array", "current_epoch", "global_step", "global_rank", "local_rank", "logger",
    "loggers", "automatic_optimization", "trainer", "fabric", "strict_loading", "device_mesh", "device", "dtype",
    "fit", "hparams", "hparams_initial", "_trainer",
]


@contextmanager
def jit_scripting(module: torch.nn.Module) -> Iterator[None]:
    """Mark ``module`` and its sub-modules as being scripted: ``trainer`` then reads None instead of raising
    (Lightning's ``_jit_is_scripting``)."""
    flagged = [m for m in module.modules() if hasattr(type(m), "_jit_is_scripting")]
    for m in flagged:
        object.__setattr__(m, "_jit_is_scripting", True)
    try:
        yield
    finally:
        for m in flagged:
            object.__setattr__(m, "_jit_is_scripting", False)


class LightningTools:
    """Mixin of :class:`taskfit.TaskModule`: Lightning's ``LightningModule`` members about ranks, gathering,
    freezing, export and Fabric (each mirrors the same-named ``LightningModule`` member)."""

    # no class annotations here: torch.jit.script would try to type the instance attributes by them
    _jit_is_scripting = False
    _fabric = None  # Fabric.setup sets it on a module that has it (never mutated in place)
    _fabric_optimizers = ()
    __jit_unused_properties__ = JIT_UNUSED_PROPERTIES

    # -- processes ---------------------------------------------------------------------------------------
    @property
    def global_rank(self) -> int:
        """Index of this process over all nodes and devices (0 when not attached to a run)."""
        return self.trainer.global_rank if self._fit is not None else 0

    @property
    def local_rank(self) -> int:
        """Index of this process on its node (0 when not attached to a run)."""
        return self.trainer.local_rank if self._fit is not None else 0

    def all_gather(self, data: Any, group: Any = None, sync_grads: bool = False) -> Any:
        """Gather ``data`` (a tensor of shape ``(batch, ...)``, a number, or a dict/list/tuple of them) from every
        process (mirrors ``LightningModule.all_gather``). Every process must call it with equal shapes.

        Args:
            data (Tensor | int | float | dict | list | tuple): what to gather; numbers become tensors on the
                module's device.
            group (ProcessGroup | None): the processes to gather from (default: all).
            sync_grads (bool): gather differentiably (gradients flow back to each process's ``data``).

        Returns:
            the same structure with tensors of shape ``(world_size, batch, ...)``; with one process the tensors
            as given (no new dimension), as Lightning.

        Raises:
            RuntimeError: the module is not attached to a run.
        """
        strategy = self.trainer.strategy
        world = strategy.world_size

        def to_tensor(x: Any) -> torch.Tensor:
            return x if isinstance(x, torch.Tensor) else torch.tensor(x, device=self.device)

        def gather(t: torch.Tensor) -> torch.Tensor:
            if world == 1:
                return t
            if sync_grads or group is not None:
                import torch.distributed as dist
                from torch.distributed.nn.functional import all_gather as differentiable_gather

                parts = (differentiable_gather(t.contiguous(), group=group or dist.group.WORLD) if sync_grads
                         else _gather_plain(t, group))
                return torch.stack(list(parts))
            return strategy.all_gather(t)

        data = apply_to_collection(data, (int, float, bool), to_tensor)
        return apply_to_collection(data, torch.Tensor, gather)

    # -- freezing ----------------------------------------------------------------------------------------
    def freeze(self) -> Any:
        """Set ``requires_grad=False`` on every parameter and switch to eval mode; returns the module."""
        for p in self.parameters():
            p.requires_grad = False
        return self.eval()

    def unfreeze(self) -> Any:
        """Set ``requires_grad=True`` on every parameter and switch to train mode; returns the module."""
        for p in self.parameters():
            p.requires_grad = True
        return self.train()

    # -- export ------------------------------------------------------------------------------------------
    @torch.no_grad()
    def to_torchscript(self, file_path: str | Path | None = None, method: str | None = "script",
                       example_inputs: Any = None, **kwargs: Any) -> Any:
        """The module as a ``torch.jit.ScriptModule`` (mirrors ``LightningModule.to_torchscript``), in eval mode;
        the module's own train/eval mode is kept.

        Args:
            file_path (str | Path | None): also save it there (``torch.jit.save``; local path or fsspec URL).
            method (str): ``"script"`` (``torch.jit.script``) or ``"trace"`` (``torch.jit.trace``).
            example_inputs (Any): the tracing input (default :attr:`example_input_array`), moved to the device.
            **kwargs: passed to ``torch.jit.script`` / ``torch.jit.trace``.

        Raises:
            ValueError: an unknown ``method``, or ``"trace"`` without ``example_inputs`` or
                ``example_input_array``.
        """
        mode = self.training
        if method == "script":
            with jit_scripting(self):
                scripted = torch.jit.script(self.eval(), **kwargs)
        elif method == "trace":
            if example_inputs is None:
                if self.example_input_array is None:
                    raise ValueError("Choosing method=`trace` requires either `example_inputs` or "
                                     "`model.example_input_array` to be defined.")
                example_inputs = self.example_input_array
            example_inputs = _to_device(example_inputs, self.device)
            with jit_scripting(self):
                scripted = torch.jit.trace(func=self.eval(), example_inputs=example_inputs, **kwargs)
        else:
            raise ValueError(f"The 'method' parameter only supports 'script' or 'trace', but value given was: "
                             f"{method}")
        self.train(mode)
        if file_path is not None:
            import fsspec

            with fsspec.open(str(file_path), "wb") as f:
                torch.jit.save(scripted, f)
        return scripted

    @torch.no_grad()
    def to_onnx(self, file_path: Any = None, input_sample: Any = None, **kwargs: Any) -> Any:
        """Export to ONNX with ``torch.onnx.export`` (mirrors ``LightningModule.to_onnx``); the train/eval mode is
        kept.

        Args:
            file_path (str | Path | BytesIO | None): where to write (None: nothing written; the dynamo exporter
                returns the ``ONNXProgram``).
            input_sample (Any): the tracing input (default :attr:`example_input_array`), moved to the device.
            **kwargs: passed to ``torch.onnx.export``.

        Raises:
            ModuleNotFoundError: ``onnx`` is not installed (Lightning's message), or ``dynamo=True`` without
                ``onnxscript``.
            ValueError: neither ``input_sample`` nor ``example_input_array``.
        """
        if importlib.util.find_spec("onnx") is None:
            raise ModuleNotFoundError(f"`{type(self).__name__}.to_onnx()` requires `onnx` to be installed.")
        if kwargs.get("dynamo", False) and importlib.util.find_spec("onnxscript") is None:
            raise ModuleNotFoundError(f"`{type(self).__name__}.to_onnx(dynamo=True)` requires `onnxscript` and "
                                      "`torch>=2.5.0` to be installed.")
        mode = self.training
        if input_sample is None:
            if self.example_input_array is None:
                raise ValueError("Could not export to ONNX since neither `input_sample` nor "
                                 "`model.example_input_array` attribute is set.")
            input_sample = self.example_input_array
        input_sample = _to_device(input_sample, self.device)
        file_path = str(file_path) if isinstance(file_path, Path) else file_path
        out = torch.onnx.export(self, input_sample, file_path, **kwargs)
        self.train(mode)
        return out

    # -- Lightning Fabric --------------------------------------------------------------------------------
    @property
    def fabric(self) -> Any:
        """The ``lightning.fabric.Fabric`` running this module (set by ``Fabric.setup``), None otherwise."""
        return self.__dict__.get("_fabric")

    @fabric.setter
    def fabric(self, fabric: Any) -> None:
        for child in self.children():
            if isinstance(child, LightningTools):
                child.fabric = fabric
        if fabric is not None and not isinstance(fabric, weakref.ProxyTypes):
            fabric = weakref.proxy(fabric)
        self.__dict__["_fabric"] = fabric


def _gather_plain(t: torch.Tensor, group: Any) -> list[torch.Tensor]:
    import torch.distributed as dist

    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t.contiguous(), group=group)
    return parts


def _to_device(sample: Any, device: torch.device) -> Any:
    return apply_to_collection(sample, torch.Tensor, lambda t: t.to(device))


def fabric_log(fabric: Any, metrics: dict[str, Any], logger: bool | None) -> None:
    """``self.log``/``self.log_dict`` of a module run by Lightning Fabric: checked, then ``fabric.log_dict`` at
    once (Lightning's ``LightningModule.log`` under Fabric).

    Raises:
        ValueError: a nested dict, or a value that is not a number or a one-element tensor.
    """
    for name, value in metrics.items():
        if isinstance(value, dict):
            raise ValueError(f"`self.log_dict({metrics})` was called, but nested dictionaries cannot be logged")
        if not isinstance(value, (torch.Tensor, int, float, bool)):
            raise ValueError(f"`self.log({name}, {value})` was called, but `{type(value).__name__}` values cannot "
                             "be logged")
        if isinstance(value, torch.Tensor) and value.numel() != 1:
            raise ValueError(f"`self.log({name}, {value})` was called, but the tensor must have a single element.")
    if logger is not False:
        fabric.log_dict(metrics, step=None)
