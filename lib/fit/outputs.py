"""What ``Fit`` hands out after training (mirrors the HF ``Trainer`` methods of the same names): the saved model
(``save_model``), printed and saved metrics (``log_metrics``, ``save_metrics``), ``trainer_state.json``
(``save_state``), the model card and the push to a hub folder: the bodies ``Fit``'s methods of those names delegate
to. They read the current or last run through ``Fit``'s public attributes (``model``, ``state``, ``args``,
``strategy``, ``logged_metrics``)."""

from __future__ import annotations

import json
from typing import Any

from lightning_utilities.core.rank_zero import rank_zero_only

from taskfit.checkpoint.writer import exportable_model, save_model_folder
from taskfit.io.checkpoint_io import join
from taskfit.io.peft_files import is_peft_model
from taskfit.loops.finite import check_finite
from taskfit.metrics import metrics_table, save_metrics_json


def _weights_to_save(fit: Any, merge_adapters: bool) -> dict[str, Any]:
    """What ``save_model``/``push_to_hub`` write from (a collective for sharded strategies: every rank calls it):
    a PEFT model under a strategy that shards parameters gathers its adapter only, never the frozen base (unless
    merging needs the full weights); any other model its full state dict."""
    model = exportable_model(fit.model)
    if is_peft_model(model) and not merge_adapters and fit.strategy.shards_parameters:
        return fit.strategy.adapter_state_dict(model)
    return fit.strategy.model_state_dict(model)


def save_model(fit: Any, output_dir: str | None = None, merge_adapters: bool = False) -> str:
    """``Fit.save_model``: the trained model (safetensors weights + config, and the processing class) written to
    ``output_dir`` (default ``args.output_dir``) on rank zero; returns the folder. A PEFT model writes its adapters,
    or with ``merge_adapters=True`` the full weights of a merged copy (the live model keeps its adapters).

    Raises:
        ValueError: no model attached yet; ``merge_adapters`` for a model without mergeable adapters.
        NonFiniteError: a parameter holds NaN or inf (non-finite weights are never written).
    """
    if fit.model is None:
        raise ValueError("save_model() before any model was given to fit/validate/predict.")
    if merge_adapters and not is_peft_model(exportable_model(fit.model)):
        raise ValueError(f"save_model(merge_adapters=True) needs a peft.PeftModel; the model is a "
                         f"{type(exportable_model(fit.model)).__name__} (no adapters to merge).")
    check_finite(fit.strategy, fit.model, fit.state.global_step, None, action="save_model refused")
    folder = output_dir or fit.args.output_dir
    weights = _weights_to_save(fit, merge_adapters)  # every rank: may be a gather
    if fit.is_global_zero:
        save_model_folder(fit, folder, weights, merge_adapters)
        fit.strategy.checkpoint_io.write_bytes(join(folder, "fit_args.json"), fit.args.to_json_string(redact=True).encode())
    fit.strategy.barrier("save_model")
    return folder


@rank_zero_only
def log_metrics(split: str, metrics: dict[str, Any]) -> None:
    """Print ``metrics`` as an aligned table (HF ``log_metrics`` with ``metrics_format``; rank zero only)."""
    print(metrics_table(split, metrics))


@rank_zero_only
def save_metrics(output_dir: str, split: str, metrics: dict[str, Any], combined: bool = True) -> None:
    """Write ``{split}_results.json`` (and merge into ``all_results.json``) under ``output_dir`` (rank zero)."""
    save_metrics_json(output_dir, split, metrics, combined)


@rank_zero_only
def save_state(fit: Any) -> None:
    """Write ``trainer_state.json`` (the loop state, HF ``save_state``) under ``output_dir`` (rank zero)."""
    data = json.dumps(fit.state.hf_dict(), indent=2, default=str).encode()
    fit.strategy.checkpoint_io.write_bytes(join(fit.args.output_dir, "trainer_state.json"), data)


def create_model_card(fit: Any, model_name: str | None = None, dataset: str | list[str] | None = None,
                      finetuned_from: str | None = None, tags: str | list[str] | None = None,
                      meta: dict[str, Any] | None = None) -> str:
    """``Fit.create_model_card``: ``README.md`` written under ``output_dir`` on rank zero; returns its text.
    ``meta``: HF's card metadata keywords (``language``, ``license``, ``tasks``, ``dataset_tags``,
    ``dataset_args``)."""
    from taskfit.checkpoint.publish import create_model_card as card_text

    card = card_text(fit, model_name, dataset, finetuned_from, tags, meta=meta)
    if fit.is_global_zero:
        fit.strategy.checkpoint_io.write_bytes(join(fit.args.output_dir, "README.md"), card.encode())
    return card


def push_to_hub(fit: Any, dataset: str | list[str] | None = None, card: dict[str, Any] | None = None,
                token: str | None = None) -> list[str]:
    """``Fit.push_to_hub``: publish the model, card and metrics now and wait; returns the failed pushes.
    ``card``: :func:`create_model_card`'s keywords (HF's); ``token`` overrides ``hub_token``."""
    from taskfit.checkpoint.publish import Publisher, hub_storage_options, hub_target, push_final

    weights = _weights_to_save(fit, False)  # every rank: may be a gather
    if not fit.is_global_zero:
        return []
    args = fit.args.replace(hub_token=token) if token else fit.args
    target = hub_target(args)
    publisher = Publisher(target, hub_storage_options(args, target), always_push=True)
    metrics = {k: v for k, v in fit.logged_metrics.items() if k.startswith("train_")}
    push_final(fit, publisher, metrics, dataset, weights, card=card)
    return publisher.finish()
