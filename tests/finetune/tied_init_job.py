"""Run by tests/finetune/test_tied_rank_zero_init.py: ``python tied_init_job.py OUT STRATEGY`` (taskfit re-launches
it per rank, 2 gloo processes). A tiny Llama whose output layer shares the input embedding
(``tie_word_embeddings=True``) is built in ``configure_model``: real (seed 0) on rank 0, on the meta device inside
``rank_zero_init`` elsewhere. At ``on_train_start`` (after the strategy set the model up) each rank records whether
the tie holds and whether its weights equal the seed-0 model's; after 2 steps, whether the tie still holds and the
full weights. Writes ``{OUT}.rank{r}.json``."""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from finetune_common import equal_rows, tiny_llama  # noqa: E402

from taskfit import Fit, TaskModule  # noqa: E402
from taskfit.core.rank_zero_init import rank_zero_init  # noqa: E402


def full(p: torch.Tensor) -> torch.Tensor:
    """The whole tensor on every rank (``full_tensor()`` of a sharded parameter: a collective)."""
    return p.full_tensor() if hasattr(p, "full_tensor") else p.detach().clone()


# kept local: a tied-embedding Llama built under rank_zero_init, recording the tie and the weights
class TiedLlama(TaskModule):
    def __init__(self) -> None:
        super().__init__()
        self.report: dict = {}

    def configure_model(self) -> None:
        with rank_zero_init() as real:
            self.llm = tiny_llama(tie_word_embeddings=True)
        self.report["built_real"] = real

    def training_step(self, batch, batch_idx):
        return self.llm(**batch).loss

    def _tied(self) -> bool:
        return self.llm.lm_head.weight is self.llm.model.embed_tokens.weight

    def on_train_start(self) -> None:
        reference = dict(tiny_llama(tie_word_embeddings=True).named_parameters())
        self.report["tied_at_start"] = self._tied()
        self.report["equal_to_rank0"] = all(torch.equal(full(p), reference[n])
                                            for n, p in self.llm.named_parameters())

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


if __name__ == "__main__":
    out, strategy = sys.argv[1:3]
    torch.set_num_threads(1)
    fit = Fit(output_dir=out, max_steps=2, per_device_train_batch_size=2, save_strategy="no", disable_tqdm=True,
              report_to="none", lr_scheduler_type="constant", strategy=strategy, devices=2, ddp_timeout=300)
    module = TiedLlama()
    fit.fit(module, equal_rows(8))
    module.report["tied_at_end"] = module._tied()
    module.report["end"] = {n: full(p).tolist() for n, p in module.llm.named_parameters()
                            if n in ("lm_head.weight", "model.embed_tokens.weight", "model.norm.weight")}
    with open(f"{out}.rank{fit.global_rank}.json", "w") as f:
        json.dump(module.report, f)
