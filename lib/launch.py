"""``strategy="ddp_spawn"``: run ``Fit.fit`` in spawned worker processes and bring rank 0's result back (mirrors
Lightning's ``_MultiProcessingLauncher``: the calling process only launches; afterwards its model holds the trained
weights and its ``Fit.state`` the final loop state)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from taskfit.fit import Fit
    from taskfit.metrics import TrainOutput


def _worker_fit(fit: Fit, model: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    out = fit.fit(model, **kwargs)
    state = {k: v.detach().cpu() for k, v in fit.model.state_dict().items()}
    return {"output": out, "model": state, "state": fit.state.state_dict()}


def spawn_fit(fit: Fit, model: Any, **kwargs: Any) -> TrainOutput:
    """Run ``fit.fit(model, **kwargs)`` in ``world_size`` spawned processes; load rank 0's trained weights into
    ``model`` (or the attached model) and its loop state into ``fit.state``; return rank 0's ``TrainOutput``.

    Everything passed must be picklable and importable by the workers (define modules and datasets at module level
    of a script guarded by ``if __name__ == "__main__":``, as ``torch.multiprocessing`` requires).
    """
    target = model if model is not None else fit.model
    result = fit.strategy.launcher.launch(_worker_fit, fit, model, kwargs)
    if target is not None:
        target.load_state_dict(result["model"])
    fit.state.load_state_dict({k: v for k, v in result["state"].items()
                               if k not in ("is_local_process_zero", "is_world_process_zero")})
    return result["output"]
