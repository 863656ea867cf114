"""What ``Fit`` hands out after training (mirrors the HF ``Trainer`` methods of the same names): the saved model
(``save_model``), printed and saved metrics (``log_metrics``, ``save_metrics``), ``trainer_state.json``
(``save_state``), the model card and the push to a hub folder. They read the current or last run through ``Fit``'s
public attributes (``model``, ``state``, ``args``, ``strategy``, ``logged_metrics``)."""

from __future__ import annotations

import json
from typing import Any

from lightning_utilities.core.rank_zero import rank_zero_only

from taskfit.checkpoint.writer import exportable_model, save_model_folder
from taskfit.io.checkpoint_io import join
from taskfit.metrics import metrics_table, save_metrics_json


class ModelOutputs:
    """Mixin of :class:`~taskfit.fit.fit.Fit`: saving, printing and publishing results."""

    args: Any
    strategy: Any
    model: Any
    state: Any
    logged_metrics: dict[str, Any]
    is_global_zero: bool

    def save_model(self, output_dir: str | None = None) -> str:
        """Write the trained model (safetensors weights + config, and the processing class) to ``output_dir``
        (default ``args.output_dir``) on rank zero; returns the folder (F-CORE-7, HF ``save_model``).

        Raises:
            ValueError: no model attached yet.
        """
        if self.model is None:
            raise ValueError("save_model() before any model was given to fit/validate/predict.")
        folder = output_dir or self.args.output_dir
        weights = self.strategy.model_state_dict(exportable_model(self.model))  # every rank: may be a gather
        if self.is_global_zero:
            save_model_folder(self, folder, weights)
            self.strategy.checkpoint_io.write_bytes(join(folder, "fit_args.json"), self.args.to_json_string(redact=True).encode())
        self.strategy.barrier("save_model")
        return folder

    @rank_zero_only
    def log_metrics(self, split: str, metrics: dict[str, Any]) -> None:
        """Print ``metrics`` as an aligned table (HF ``log_metrics`` with ``metrics_format``)."""
        print(metrics_table(split, metrics))

    @rank_zero_only
    def save_metrics(self, split: str, metrics: dict[str, Any], combined: bool = True) -> None:
        """Write ``{split}_results.json`` (and merge into ``all_results.json``) under ``output_dir``."""
        save_metrics_json(self.args.output_dir, split, metrics, combined)

    @rank_zero_only
    def save_state(self) -> None:
        """Write ``trainer_state.json`` (the loop state, HF ``save_state``) under ``output_dir`` (path or URL)."""
        data = json.dumps(self.state.hf_dict(), indent=2, default=str).encode()
        self.strategy.checkpoint_io.write_bytes(join(self.args.output_dir, "trainer_state.json"), data)

    def create_model_card(self, model_name: str | None = None, dataset: str | list[str] | None = None,
                          finetuned_from: str | None = None, tags: list[str] | None = None) -> str:
        """Write ``README.md`` (the model card, see :func:`taskfit.checkpoint.publish.create_model_card`) under ``output_dir``
        on rank zero and return its text (HF ``create_model_card``)."""
        from taskfit.checkpoint.publish import create_model_card

        card = create_model_card(self, model_name, dataset, finetuned_from, tags)
        if self.is_global_zero:
            self.strategy.checkpoint_io.write_bytes(join(self.args.output_dir, "README.md"), card.encode())
        return card

    def push_to_hub(self, dataset: str | list[str] | None = None) -> list[str]:
        """Publish the model, card and metrics now to ``hub_model_id`` (HF ``push_to_hub``; see
        :mod:`taskfit.checkpoint.publish`) and wait for it; returns the failed pushes (empty when it worked)."""
        from taskfit.checkpoint.publish import Publisher, hub_storage_options, hub_target, push_final

        weights = self.strategy.model_state_dict(exportable_model(self.model))  # every rank: may be a gather
        if not self.is_global_zero:
            return []
        target = hub_target(self.args)
        publisher = Publisher(target, hub_storage_options(self.args, target), always_push=True)
        metrics = {k: v for k, v in self.logged_metrics.items() if k.startswith("train_")}
        push_final(self, publisher, metrics, dataset, weights)
        return publisher.finish()
