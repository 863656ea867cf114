"""taskfit's packing (``taskfit.data.pack_dataset``) and completion-only rows on a tiny Llama built from a config
(fp32 CPU SDPA): packed sequences see only themselves, a packed run equals the unpacked run of the same sequences
(the same per-token loss weighting, with exact gradient accumulation), and a packed LoRA run under ``taskfit.hf``
equals ``transformers.Trainer``'s on the same rows (the peer as oracle)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

pytest.importorskip("transformers")

from finetune_common import both, lora_model, stable, tiny_llama, token_rows, weights  # noqa: E402

from taskfit import Fit  # noqa: E402
from taskfit.data import assistant_only_row, completion_only_row, pack_dataset, pack_indices  # noqa: E402

MAX_LENGTH = 24


def completion_rows(n: int = 24) -> list[dict[str, list[int]]]:
    """:func:`token_rows` split into a 2..4-token prompt (no loss) and the completion."""
    return [completion_only_row(r["input_ids"][:2 + i % 3], r["input_ids"][2 + i % 3:])
            for i, r in enumerate(token_rows(n))]


def test_pack_indices_bfd_and_greedy_F_FT_3():
    """Both strategies place every sequence once without overflowing a row; best-fit decreasing (TRL's ``bfd``)
    fills rows tighter than greedy on this input; bad input is refused naming the value and the choices."""
    lengths = [5, 9, 7, 3, 8, 2, 6, 4, 10]
    bfd, greedy = pack_indices(lengths, 12, "bfd"), pack_indices(lengths, 12, "greedy")
    assert greedy == [[0], [1], [2, 3], [4, 5], [6, 7], [8]]
    assert bfd == [[8, 5], [1, 3], [4, 7], [2, 0], [6]]
    for rows in (bfd, greedy):
        assert sorted(sum(rows, [])) == list(range(len(lengths)))
        assert all(sum(lengths[i] for i in row) <= 12 for row in rows)
    assert len(bfd) == 5 < len(greedy)
    with pytest.raises(ValueError, match="'wrapped'.*bfd, greedy"):
        pack_indices(lengths, 12, "wrapped")
    with pytest.raises(ValueError, match="Sequence 8 has 10 tokens.*max_length=9"):
        pack_indices(lengths, 9)


def test_pack_dataset_rows_and_masks_F_FT_3():
    """Fixed-length rows: positions restart per sequence, the first token of each sequence and the padding carry
    no label; completion-only and assistant-only rows mask the prompt; ``truncate`` cuts long sequences."""
    rows = [completion_only_row([1, 2], [3, 4, 5]), {"input_ids": [6, 7, 8, 9]}]
    packed = pack_dataset(rows, 10, strategy="greedy", pad_token_id=0)
    assert packed == [{"input_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9, 0],
                       "labels": [-100, -100, 3, 4, 5, -100, 7, 8, 9, -100],
                       "position_ids": [0, 1, 2, 3, 4, 0, 1, 2, 3, 0]}]
    assert assistant_only_row([4, 5, 6], [0, 1, 1]) == {"input_ids": [4, 5, 6], "labels": [-100, 5, 6]}
    assert pack_dataset([{"input_ids": list(range(1, 8))}], 4, truncate=True)[0]["input_ids"] == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="Sequence 0 has 7 tokens"):
        pack_dataset([{"input_ids": list(range(1, 8))}], 4)
    with pytest.raises(ValueError, match="'labels' has 2 entries but 'input_ids' has 3"):
        pack_dataset([{"input_ids": [1, 2, 3], "labels": [1, 2]}], 4)
    with pytest.raises(ValueError, match="completion_ids is empty"):
        completion_only_row([1, 2], [])


def test_packed_sequences_are_isolated_on_cpu_sdpa_F_FT_3():
    """Llama on CPU SDPA with packed rows (``position_ids`` restarting, no attention mask): every sequence's
    logits equal its logits alone; with an all-ones attention mask (what a plain collator would add) they do not,
    so the isolation comes from the position ids."""
    rows = token_rows(12)
    model = tiny_llama().eval()
    model.config.use_cache = False  # taskfit does this while training (TrainingArguments.use_cache=False)
    bins = pack_indices([len(r["input_ids"]) for r in rows], MAX_LENGTH)
    packed = pack_dataset(rows, MAX_LENGTH)
    ids, pos = (torch.tensor([r[k] for r in packed]) for k in ("input_ids", "position_ids"))
    with torch.no_grad():
        isolated = model(input_ids=ids, position_ids=pos).logits
        mixed = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        worst = {"isolated": 0.0, "mixed": 0.0}
        for r, row in enumerate(bins):
            start = 0
            for i in row:
                n = len(rows[i]["input_ids"])
                alone = model(input_ids=torch.tensor([rows[i]["input_ids"]])).logits[0]
                worst["isolated"] = max(worst["isolated"], (isolated[r, start:start + n] - alone).abs().max().item())
                worst["mixed"] = max(worst["mixed"], (mixed[r, start:start + n] - alone).abs().max().item())
                start += n
    assert worst["isolated"] < 1e-5 and worst["mixed"] > 1e-2, worst


def _pad(rows: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
    """Right-padded batch of unpacked rows (pad id 0, label -100, attention mask 0 on the padding)."""
    n = max(len(r["input_ids"]) for r in rows)
    batch: dict[str, list] = {"input_ids": [], "attention_mask": [], "labels": []}
    for r in rows:
        pad = n - len(r["input_ids"])
        batch["input_ids"].append(r["input_ids"] + [0] * pad)
        batch["attention_mask"].append([1] * len(r["input_ids"]) + [0] * pad)
        batch["labels"].append(r["labels"] + [-100] * pad)
    return {k: torch.tensor(v) for k, v in batch.items()}


def _fit(model: Any, data: Any, out: str, **kw: Any) -> list[float]:
    fit = Fit(output_dir=out, optim="sgd", learning_rate=0.5, lr_scheduler_type="constant", logging_steps=1,
              report_to="none", save_strategy="no", train_sampling_strategy="sequential", num_train_epochs=1,
              disable_tqdm=True, **kw)
    fit.fit(model, data)
    return [r["loss"] for r in fit.state.log_history if "loss" in r]


@pytest.mark.parametrize("kind", ["plain", "lora"])
def test_packed_run_equals_unpacked_run_F_FT_3(tmp_path, kind):
    """3 optimizer steps of completion-only rows: packed (4 rows of 24 tokens a step, 2 micro-batches of 2 rows
    with different completion-token counts, exact accumulation) and unpacked (the same sequences of each step as
    one padded batch) give the same logged losses and weights within 1e-6: the loss of a step averages over all
    of its completion tokens either way."""
    rows = completion_rows()
    build = tiny_llama if kind == "plain" else lora_model
    bins = pack_indices([len(r["input_ids"]) for r in rows], MAX_LENGTH)
    packed = pack_dataset(rows, MAX_LENGTH)
    steps = [sum(bins[s:s + 4], []) for s in range(0, len(bins), 4)]
    assert len(steps) == 3 and len(bins) > 8
    unpacked = DataLoader(rows, batch_sampler=steps, collate_fn=_pad)

    packed_model, unpacked_model, start = build(), build(), weights(build())
    packed_loss = _fit(packed_model, packed, str(tmp_path / "p"), per_device_train_batch_size=2,
                       gradient_accumulation_steps=2)
    unpacked_loss = _fit(unpacked_model, unpacked, str(tmp_path / "u"))
    assert len(packed_loss) == len(unpacked_loss) == 3
    assert packed_loss == pytest.approx(unpacked_loss, rel=1e-6, abs=1e-6)
    w_packed, w_unpacked = weights(packed_model), weights(unpacked_model)
    diff = max((w_packed[k] - w_unpacked[k]).abs().max().item() for k in w_packed)
    moved = max((w_packed[k] - start[k]).abs().max().item() for k in w_packed)
    assert diff < 1e-6 < 1e-3 < moved, (diff, moved)


def test_packed_lora_rows_same_as_transformers_F_FT_3(tmp_path):
    """The packed rows with a LoRA model under ``taskfit.hf.Trainer`` and under ``transformers.Trainer`` (which
    keeps ``position_ids`` by reading the base model's signature): bitwise the same log history and adapter."""
    pytest.importorskip("accelerate")
    packed = pack_dataset(completion_rows(), MAX_LENGTH)

    def run(m: Any, out: str) -> tuple[list, dict]:
        model = lora_model()
        args = m.TrainingArguments(output_dir=out, per_device_train_batch_size=2, max_steps=3, logging_steps=1,
                                   learning_rate=1e-2, report_to="none", save_strategy="no", use_cpu=True)
        trainer = m.Trainer(model=model, args=args, train_dataset=packed)
        trainer.train()
        return stable(trainer.state.log_history), weights(model)

    (hf_log, hf_w), (tf_log, tf_w) = both(run, tmp_path)
    assert tf_log == hf_log
    for k in hf_w:
        assert torch.equal(tf_w[k], hf_w[k]), k
