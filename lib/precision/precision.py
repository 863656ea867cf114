"""Precision plugins: numerics only (dtype conversion, autocast, loss scaling, backward, optimizer step).

Mirrors Lightning's ``Precision`` plugins; names as in Lightning (``"32-true"``, ``"16-mixed"``, ``"bf16-mixed"``,
``"16-true"``, ``"bf16-true"``, ``"64-true"``). HF ``fp16=True`` means ``"16-mixed"`` and ``bf16=True`` means
``"bf16-mixed"`` (see ``FitArguments.resolved_precision``).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager

import torch

from taskfit.registry import invalid_choice


class Precision:
    """Full fp32 precision (``"32-true"``): the base plugin that every other one refines.

    Hooks are called by the strategy in this order per optimizer step: :meth:`forward_context` around each
    ``training_step``, :meth:`backward` per micro-batch, :meth:`unscale_gradients` once per optimizer before the
    ``on_before_optimizer_step`` hook and gradient clipping (``Strategy.before_optimizer_step``), then
    :meth:`optimizer_step`, which unscales first when nothing did yet (manual optimization, ``Engine``).
    """

    name = "32-true"
    #: dtype parameters are converted to by :meth:`convert_module`; ``None`` leaves them as they are
    param_dtype: torch.dtype | None = None
    #: dtype of ``torch.autocast`` in :meth:`forward_context` (mixed precision); ``None``: no autocast
    autocast_dtype: torch.dtype | None = None
    #: whether losses are scaled (``"16-mixed"``: needs a ``GradScaler`` for the device kind)
    loss_scaling: bool = False

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype matmuls run in: the autocast dtype, else the parameter dtype, else ``torch.float32``."""
        return self.autocast_dtype or self.param_dtype or torch.float32

    def setup_device(self, device: torch.device) -> None:
        """Check that this plugin can run on ``device`` and prepare per-device state (the loss scaler).

        Called once by the connector when ``Fit`` is built, before any work.

        Raises:
            ValueError: the device cannot run this precision (the message names the device and a working choice).
        """

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Cast ``module``'s floating-point parameters and buffers to :attr:`param_dtype` (in place)."""
        return module.to(dtype=self.param_dtype) if self.param_dtype is not None else module

    def convert_input(self, data: Any) -> Any:
        """Cast floating-point tensors of a batch to :attr:`param_dtype` (true-precision plugins only)."""
        if self.param_dtype is None:
            return data
        from lightning_utilities.core.apply_func import apply_to_collection

        dtype = self.param_dtype
        return apply_to_collection(data, torch.Tensor, lambda t: t.to(dtype) if t.is_floating_point() else t)

    def forward_context(self, device_type: str = "cpu") -> ContextManager:
        """Context for forward passes (autocast for mixed precision). A no-op here."""
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Backpropagate ``loss`` (a scalar tensor); ``args``/``kwargs`` go to ``Tensor.backward`` (``retain_graph``:
        Lightning's ``manual_backward(loss, retain_graph=True)``)."""
        loss.backward(*args, **kwargs)

    def unscale_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Undo loss scaling before gradient clipping (only scaling plugins do anything; the plugin tracks which
        optimizers it unscaled this step, so a second call for the same optimizer is a no-op)."""

    def optimizer_step(self, optimizer: torch.optim.Optimizer, closure: Callable[[], Any] | None = None,
                       **kwargs: Any) -> bool:
        """Run ``optimizer.step()``, or ``optimizer.step(closure=closure, **kwargs)`` when a closure or keyword
        arguments are given (Lightning's ``Precision.optimizer_step``: the optimizer calls the closure, which runs
        forward, backward and the hooks before the update; ``LBFGS`` calls it several times). Returns False when
        the step was skipped (non-finite scaled gradients)."""
        if closure is None and not kwargs:
            optimizer.step()
        else:
            optimizer.step(closure=closure, **kwargs)
        return True

    def log_values(self) -> dict[str, float]:
        """Values added to the training logs at logging steps (``loss_scale``, ``skipped_steps``); empty here."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Plugin state for checkpoints (e.g. the loss scaler); empty for plugins without state."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""


class DoublePrecision(Precision):
    """``"64-true"``: parameters, buffers and floating-point inputs in float64."""

    name = "64-true"
    param_dtype = torch.float64


_TRUE_NAMES = {torch.bfloat16: "bf16-true", torch.float16: "16-true"}
_MIXED_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


class HalfTruePrecision(Precision):
    """``"bf16-true"`` / ``"16-true"``: parameters, buffers and floating-point inputs in a 16-bit dtype, no fp32
    master copy (mirrors Lightning's ``HalfPrecision``). Halves weight, gradient and optimizer-state memory; small
    updates can be lost to rounding, and fp16 overflows above 65504 (no loss scaling here).

    Args:
        dtype (torch.dtype): ``torch.bfloat16`` (default) or ``torch.float16``.

    Raises:
        ValueError: another dtype.
    """

    def __init__(self, dtype: torch.dtype = torch.bfloat16) -> None:
        if dtype not in _TRUE_NAMES:
            raise invalid_choice("true-precision dtype", dtype, [str(d) for d in _TRUE_NAMES])
        self.param_dtype = dtype
        self.name = _TRUE_NAMES[dtype]


def cpu_grad_scaler_supported() -> bool:
    """Whether this PyTorch has ``torch.amp.GradScaler("cpu")`` (2.3 and later)."""
    try:
        torch.amp.GradScaler("cpu", enabled=True)
    except (AttributeError, TypeError, RuntimeError, ValueError):
        return False
    return True


class MixedPrecision(Precision):
    """``"bf16-mixed"`` / ``"16-mixed"``: fp32 parameters (the master weights), forward under
    ``torch.autocast(dtype=bfloat16|float16)``; mirrors Lightning's ``MixedPrecision`` and HF ``bf16``/``fp16``.

    ``"16-mixed"`` adds dynamic loss scaling with ``torch.amp.GradScaler(device_type)``: :meth:`backward` scales
    the loss, :meth:`unscale_gradients` divides the gradients by the scale before clipping (once per step),
    :meth:`optimizer_step` skips the step when any gradient is inf/NaN, halves the scale and counts the skip in
    :attr:`skipped_steps` (the scale is updated once per step, after the last unscaled optimizer stepped, as
    ``GradScaler``'s docs ask for several optimizers) (reported as ``skipped_steps`` and ``loss_scale`` in the logs). bfloat16 has fp32's
    exponent range and needs no scaling.

    Args:
        precision (str): ``"bf16-mixed"`` (default) or ``"16-mixed"``.
        scaler (torch.amp.GradScaler | None): a scaler to use for ``"16-mixed"``; by default one is made for the
            device in :meth:`setup_device` (``init_scale=2**16``, ``growth_interval=2000``, PyTorch's defaults).

    Raises:
        ValueError: an unknown ``precision``; a ``scaler`` with ``"bf16-mixed"``.
    """

    def __init__(self, precision: str = "bf16-mixed", scaler: Any = None) -> None:
        if precision not in _MIXED_DTYPES:
            raise invalid_choice("mixed precision", precision, _MIXED_DTYPES)
        if scaler is not None and precision != "16-mixed":
            raise ValueError(f"A GradScaler is only used with precision='16-mixed', got precision={precision!r}.")
        self.name = precision
        self.dtype = self.autocast_dtype = _MIXED_DTYPES[precision]
        self.loss_scaling = precision == "16-mixed"
        self.scaler = scaler
        self.skipped_steps = 0
        self._unscaled: set[int] = set()  # ids of the optimizers unscaled since their last step
        self._pending_state: dict[str, Any] | None = None

    def setup_device(self, device: torch.device) -> None:
        """Make the ``GradScaler`` for ``device`` (``"16-mixed"``).

        Raises:
            ValueError: ``"16-mixed"`` on a CPU whose PyTorch has no CPU ``GradScaler``, or on a device kind
                without float16 autocast (XLA); the message suggests ``"bf16-mixed"``.
        """
        kind = torch.device(device).type
        if not self.loss_scaling or self.scaler is not None:
            return
        if kind == "cpu" and not cpu_grad_scaler_supported():
            raise ValueError(f"precision='16-mixed' on the CPU needs torch.amp.GradScaler('cpu'), which torch "
                             f"{torch.__version__} lacks; use precision='bf16-mixed' (no loss scaling needed).")
        if kind not in ("cpu", "cuda", "mps", "xpu"):
            raise ValueError(f"precision='16-mixed' is not supported on {kind!r} devices; use 'bf16-mixed'.")
        self.scaler = torch.amp.GradScaler(kind)
        if self._pending_state is not None:
            self.load_state_dict(self._pending_state)

    def forward_context(self, device_type: str = "cpu") -> ContextManager:
        return torch.autocast(device_type=device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Backpropagate ``loss`` (scaled by the current loss scale under ``"16-mixed"``); ``args``/``kwargs`` go to
        ``Tensor.backward``."""
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        loss.backward(*args, **kwargs)

    def unscale_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide ``optimizer``'s gradients by the loss scale (``"16-mixed"``), at most once per optimizer per
        step (``GradScaler.unscale_`` raises on a second call); nothing when none of its parameters has a
        gradient (a skipped batch: the scaler's state stays as it was, as Lightning does not unscale then)."""
        if self.scaler is not None and id(optimizer) not in self._unscaled and not self._no_gradients(optimizer):
            self.scaler.unscale_(optimizer)
            self._unscaled.add(id(optimizer))

    def _no_gradients(self, optimizer: torch.optim.Optimizer) -> bool:
        """No parameter of ``optimizer`` has a gradient (not yet unscaled this step); stops at the first that has
        one, so a trained step costs one look."""
        if id(optimizer) in self._unscaled:
            return False
        return all(p.grad is None for group in optimizer.param_groups for p in group["params"])

    def optimizer_step(self, optimizer: torch.optim.Optimizer, closure: Callable[[], Any] | None = None,
                       **kwargs: Any) -> bool:
        """Step (``GradScaler.step`` under ``"16-mixed"``, then ``update`` once the step's last unscaled optimizer
        stepped); False when inf/NaN gradients skipped it. ``closure``/``kwargs`` as :meth:`Precision.optimizer_step`;
        under ``"16-mixed"`` the closure runs once before the scaler's step (Lightning's ``MixedPrecision``).

        Raises:
            ValueError: ``torch.optim.LBFGS`` under ``"16-mixed"`` (it re-evaluates the closure, which a scaler's
                skipped steps do not allow; Lightning refuses it too).
        """
        if self.scaler is None:
            return super().optimizer_step(optimizer, closure, **kwargs)
        if isinstance(optimizer, torch.optim.LBFGS):
            raise ValueError("precision='16-mixed' (a GradScaler) and the LBFGS optimizer are not compatible; use "
                             "'32-true' or 'bf16-mixed'.")
        if closure is not None:
            closure()
        if self._no_gradients(optimizer):  # e.g. a training_step that returned None: nothing to unscale or step,
            return True  # and the scale is not updated (Lightning's MixedPrecision skips unscale_, step and update)
        self.unscale_gradients(optimizer)  # records found_inf for this optimizer
        try:  # GradScaler.step syncs on these flags too, so reading them costs no extra wait
            found = self.scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"]
            found_inf = bool(sum(v.item() for v in found.values()))
        except (AttributeError, KeyError):  # pragma: no cover - private layout changed: compare the scales
            found_inf = None
            before = self.scaler.get_scale()
        self.scaler.step(optimizer, **kwargs)
        self._unscaled.discard(id(optimizer))
        if not self._unscaled:  # every optimizer of the step stepped: one update (it resets the scaler's
            self.scaler.update()  # per-optimizer states, so an earlier one would unscale the others twice)
        if found_inf is None:  # pragma: no cover
            found_inf = self.scaler.get_scale() < before
        if found_inf:
            self.skipped_steps += 1
        return not found_inf

    def log_values(self) -> dict[str, float]:
        """``{"loss_scale": float, "skipped_steps": int}`` under ``"16-mixed"`` (one host sync), else empty."""
        if self.scaler is None:
            return {}
        return {"loss_scale": float(self.scaler.get_scale()), "skipped_steps": self.skipped_steps}

    def state_dict(self) -> dict[str, Any]:
        """``{"scaler": GradScaler.state_dict(), "skipped_steps": int}`` under ``"16-mixed"``, else empty."""
        if self.scaler is None:
            return {}
        return {"scaler": self.scaler.state_dict(), "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (kept until the scaler exists if it does not yet)."""
        if not state:
            return
        if self.scaler is None:
            self._pending_state = dict(state)
            return
        self.scaler.load_state_dict(state["scaler"])
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self._pending_state = None


#: parameter dtype of each precision name that is not mixed (mixed names keep fp32 parameters)
_NAME_PARAM_DTYPES = {"32-true": None, "64-true": torch.float64, "bf16-true": torch.bfloat16,
                      "16-true": torch.float16}


class StrategyPrecision(MixedPrecision):
    """Base of the plugins a strategy family needs for every precision name (:class:`~taskfit.precision.fsdp.
    FSDPPrecision`, :class:`~taskfit.precision.xla.XLAPrecision`): a mixed name behaves as :class:`MixedPrecision`
    (autocast, loss scaling for ``"16-mixed"``), a true name as :class:`Precision` / :class:`HalfTruePrecision`
    (parameters and inputs in that dtype, no autocast). Mirrors Lightning Fabric's per-strategy plugins.

    Args:
        precision (str): one of :attr:`names`.
        scaler (torch.amp.GradScaler | None): as :class:`MixedPrecision` (``"16-mixed"`` only).

    Raises:
        ValueError: a name outside :attr:`names` (with the valid choices); a ``scaler`` with another name.
    """

    names: tuple[str, ...] = ("32-true", "64-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true")

    def __init__(self, precision: str = "32-true", scaler: Any = None) -> None:
        if precision not in self.names:
            raise invalid_choice(f"{type(self).__name__} precision", precision, self.names)
        if scaler is not None and precision != "16-mixed":
            raise ValueError(f"A GradScaler is only used with precision='16-mixed', got precision={precision!r}.")
        super().__init__(precision if precision in _MIXED_DTYPES else "bf16-mixed", scaler)
        if precision not in _MIXED_DTYPES:  # a true precision: no autocast, no scaler, parameters in its dtype
            self.name, self.dtype, self.autocast_dtype = precision, None, None
            self.param_dtype = _NAME_PARAM_DTYPES[precision]

    def forward_context(self, device_type: str = "cpu") -> ContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device_type, dtype=self.autocast_dtype)
