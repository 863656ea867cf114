"""``torch.compile`` (F-MEM-2): HF ``torch_compile``, ``torch_compile_backend``, ``torch_compile_mode``."""

from __future__ import annotations

from typing import Any

from torch import nn

#: ``torch.compile`` modes (``None`` = PyTorch's default)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_DONE = "_taskfit_compiled"


def check_compile_options(backend: str | None, mode: str | None) -> None:
    """Check ``torch_compile_backend`` / ``torch_compile_mode`` before any work.

    Raises:
        ValueError: a backend ``torch._dynamo.list_backends`` does not know, or an unknown mode (both list the
            valid choices).
    """
    from taskfit.registry import invalid_choice

    if mode is not None and mode not in COMPILE_MODES:
        raise invalid_choice("torch_compile_mode", mode, COMPILE_MODES)
    if backend is not None:
        import torch._dynamo

        backends = torch._dynamo.list_backends(exclude_tags=None)
        if backend not in backends:
            raise invalid_choice("torch_compile_backend", backend, backends)


def compile_targets(module: nn.Module) -> list[nn.Module]:
    """What gets compiled: the wrapped model of a plain-model run (``ModelTaskModule.model``); a TaskModule that
    defines ``forward`` itself; otherwise each direct child of the TaskModule that holds parameters."""
    from taskfit.core.module import TaskModule
    from taskfit.core.wrapping import ModelTaskModule

    if isinstance(module, ModelTaskModule):
        return [module.model]
    if not isinstance(module, TaskModule) or type(module).forward is not nn.Module.forward:
        return [module]
    return [child for child in module.children() if any(True for _ in child.parameters())]


def compile_module(module: nn.Module, backend: str | None = None, mode: str | None = None) -> list[nn.Module]:
    """Compile ``module``'s compute in place with ``nn.Module.compile`` (mirrors HF ``torch_compile=True``).

    In-place compilation keeps the module objects and therefore the state-dict keys (no ``_orig_mod.`` prefix),
    so checkpoints and ``save_model`` see the uncompiled names. Each target is compiled once: calling this again
    (a second ``fit``) does nothing. ``training_step`` itself stays eager, so ``self.log`` works as usual; a
    ``self.log`` inside a compiled ``forward`` causes a graph break and works too.

    Args:
        module (nn.Module): the TaskModule (see :func:`compile_targets` for what is compiled).
        backend (str | None): ``torch.compile`` backend (``None`` = ``"inductor"``).
        mode (str | None): one of :data:`COMPILE_MODES` or None.

    Returns:
        list[nn.Module]: the modules compiled by this call (empty when already compiled).

    Raises:
        ValueError: a bad backend or mode (see :func:`check_compile_options`).
    """
    check_compile_options(backend, mode)
    kwargs: dict[str, Any] = {"backend": backend or "inductor"}
    if mode is not None:
        kwargs["mode"] = mode
    done = []
    for target in compile_targets(module):
        if getattr(target, _DONE, None) is None:
            target.compile(**kwargs)
            setattr(target, _DONE, dict(kwargs))
            done.append(target)
    return done
