"""Run by tests/finetune/test_deepspeed_rank_zero_init.py: ``python deepspeed_init_job.py OUT STRATEGY MODE``
(taskfit re-launches it per rank, 2 gloo processes). A 16-layer Llama with tied input/output embeddings (63 MB fp32 in
tensors of 1 MB at most, so a full copy shows in the peak memory) is built in ``configure_model``: with ``MODE=meta``
real (seed 0) on rank 0 and on the meta device inside ``rank_zero_init`` elsewhere; with ``MODE=real`` real on every
rank (the run to equal). Each rank records how much its peak resident set (``ru_maxrss``) grew from building the model
to the call of ``deepspeed.initialize`` (the model built and filled from rank 0, nothing of the engine yet) and to
``on_train_start`` (the engine's own buffers included); at ``on_train_start`` whether the tie holds and whether its
full weights equal the seed-0 model's; after 2 steps whether the tie still holds. Writes ``{OUT}.rank{r}.json`` and
the full trained weights to ``{OUT}.rank{r}.pt``."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from finetune_common import equal_rows, tiny_llama  # noqa: E402

from taskfit import Fit, TaskModule  # noqa: E402
from taskfit.core.rank_zero_init import rank_zero_init  # noqa: E402

#: 16 layers of ~1M parameters (the largest tensor 256 x 1024: 1 MiB), the small vocabulary's embedding tied
SIZES = dict(tie_word_embeddings=True, hidden_size=256, intermediate_size=1024, num_hidden_layers=16)


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far (``ru_maxrss``, KiB on Linux), in bytes."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's whole parameters on every rank (gathered under ZeRO-3: a collective)."""
    params = list(model.named_parameters())
    partitioned = [p for _, p in params if hasattr(p, "ds_id")]
    gather = contextlib.nullcontext()
    if partitioned:
        import deepspeed

        gather = deepspeed.zero.GatheredParameters(partitioned, modifier_rank=None)
    with gather:
        return {n: p.detach().clone() for n, p in params}


# kept local: a 16-layer tied Llama built under rank_zero_init, recording the tie and the peak memory
class TiedLlama(TaskModule):
    def __init__(self, meta: bool) -> None:
        super().__init__()
        self.meta = meta
        self.report: dict = {}

    def configure_model(self) -> None:
        self.report["peak_before_bytes"] = peak_rss_bytes()
        init = rank_zero_init() if self.meta else contextlib.nullcontext(True)
        with init as real:
            self.llm = tiny_llama(**SIZES)
        self.report["built_real"] = real
        self.report["model_bytes"] = sum(p.numel() * p.element_size() for p in self.llm.parameters())

    def training_step(self, batch, batch_idx):
        return self.llm(**batch).loss

    def _tied(self) -> bool:
        return self.llm.lm_head.weight is self.llm.model.embed_tokens.weight

    def on_train_start(self) -> None:
        self.report["peak_added_bytes"] = peak_rss_bytes() - self.report["peak_before_bytes"]
        self.report["tied_at_start"] = self._tied()
        reference = dict(tiny_llama(**SIZES).named_parameters())
        held = full_state(self.llm)
        self.report["equal_to_rank0"] = sorted(held) == sorted(reference) and all(
            torch.equal(v, reference[n]) for n, v in held.items())

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def record_peak_at_initialize(report: dict) -> None:
    """Wrap ``deepspeed.initialize`` to record the peak growth when it is called (after the strategy's fill)."""
    import deepspeed

    initialize = deepspeed.initialize

    def recording(*args, **kwargs):
        report["peak_at_initialize_bytes"] = peak_rss_bytes() - report["peak_before_bytes"]
        return initialize(*args, **kwargs)

    deepspeed.initialize = recording


if __name__ == "__main__":
    out, strategy, mode = sys.argv[1:4]
    torch.set_num_threads(1)
    tiny_llama()  # imports the Llama code and warms torch up before the first measurement
    fit = Fit(output_dir=out, max_steps=2, per_device_train_batch_size=2, save_strategy="no", disable_tqdm=True,
              report_to="none", lr_scheduler_type="constant", strategy=strategy, devices=2, ddp_timeout=300)
    module = TiedLlama(meta=mode == "meta")
    record_peak_at_initialize(module.report)
    fit.fit(module, equal_rows(8))
    module.report["tied_at_end"] = module._tied()
    torch.save(full_state(module.llm), f"{out}.rank{fit.global_rank}.pt")
    with open(f"{out}.rank{fit.global_rank}.json", "w") as f:
        json.dump(module.report, f)
