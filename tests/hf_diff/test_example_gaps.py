"""Differences found by running transformers' own example scripts (run_classification.py, run_clm.py) under
``taskfit.hf`` (tests/peers/run_hf_examples.py), each closed and asserted here with transformers as the oracle:
the tokenizer's special tokens written into the model's config by ``train()``; what a checkpoint folder holds (the
processing class's files, ``generation_config.json``, ``config.json``'s ``architectures``); what its
``trainer_state.json`` records (``eval_steps`` without step evaluation, ``should_log``/``should_evaluate`` once
the row is logged and the evaluation done). And one documented difference: a GPT-2's loss count."""

from __future__ import annotations

import json
import os

import pytest
import torch
from common import RegressionDataset, RegressionModel, args_for, both

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers.Trainer needs it


def _json(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _tokenizer():
    """A real fast tokenizer built here (word-level over a few words; nothing downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "in", "the", "beginning", "god", "created", "heaven"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                                                model_max_length=8)


@pytest.mark.parametrize("eval_strategy", ["no", "steps"])
def test_trainer_state_eval_steps_and_control_flags_at_a_save(tmp_path, eval_strategy):
    """A checkpoint's ``trainer_state.json`` records ``eval_steps`` as HF does (TrainerState's 500 unless
    evaluation runs on steps, then ``logging_steps``) and the control flags of the save point: ``should_log`` is
    False once the step's row is logged (HF's ``on_log`` clears it), ``should_evaluate`` False once the evaluation
    ran (``on_evaluate``), ``should_save`` True."""

    def scenario(m, out):
        args = args_for(m, out, max_steps=4, save_strategy="steps", save_steps=4, logging_steps=2,
                        eval_strategy=eval_strategy)
        m.Trainer(RegressionModel(), args, train_dataset=RegressionDataset(length=32),
                  eval_dataset=RegressionDataset(length=8)).train()
        with open(os.path.join(out, "checkpoint-4", "trainer_state.json")) as f:
            state = json.load(f)
        return state["eval_steps"], state["stateful_callbacks"]["TrainerControl"]["args"]

    hf, tf = both(scenario, tmp_path)
    assert tf == hf
    assert hf[0] == (500 if eval_strategy == "no" else 2)
    assert hf[1]["should_log"] is False and hf[1]["should_evaluate"] is False and hf[1]["should_save"] is True


def _causal_lm(kind: str):
    """A tiny GPT-2 or Llama; the Llama's config names the headless class and has no pad token, as
    ``from_pretrained`` of a folder saved from ``LlamaModel`` leaves it."""
    torch.manual_seed(0)
    if kind == "gpt2":
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(  # no dropout: the loss is deterministic
            vocab_size=8, n_embd=8, n_layer=1, n_head=2, n_positions=8, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0))
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=8, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=8, bos_token_id=2, eos_token_id=3,
        architectures=["LlamaModel"]))


class _Rows(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.ids = torch.randint(0, 8, (8, 8), generator=torch.Generator().manual_seed(1))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_causal_lm_loss_is_the_mean_over_predicted_tokens(tmp_path, kind):
    """taskfit's logged loss is the model's own mean over the shifted (predicted) tokens. transformers 5 divides the
    summed loss by the labels counted after the shift for a model whose ``loss_type`` is ``ForCausalLM`` (Llama:
    the same number) but before it for GPT-2 (``loss_type`` None): 7/8 of the mean on rows of 8 tokens, the
    documented difference (docs/hf.md, differences)."""

    def scenario(m, out):
        model = _causal_lm(kind)
        with torch.no_grad():
            own = float(model(input_ids=_Rows().ids, labels=_Rows().ids).loss)
        args = args_for(m, out, max_steps=1, logging_steps=1, per_device_train_batch_size=8)
        trainer = m.Trainer(model, args, train_dataset=_Rows(), data_collator=transformers.default_data_collator)
        trainer.train()
        return own, trainer.state.log_history[0]["loss"]

    (own, hf_loss), (own_tf, tf_loss) = both(scenario, tmp_path)
    assert own_tf == own
    assert tf_loss == pytest.approx(own, rel=1e-6)
    assert hf_loss == pytest.approx(own * (7 / 8 if kind == "gpt2" else 1.0), rel=1e-6)



def test_checkpoint_holds_what_save_pretrained_and_the_processing_class_write(tmp_path):
    """What run_clm.py's checkpoint holds under HF: ``train()`` first writes the tokenizer's pad token id into the
    model's config and generation config (HF's ``align_special_tokens``); every checkpoint then holds
    ``config.json`` naming the model's own class (``save_pretrained``), ``generation_config.json`` of a generative
    model and the processing class's files (``Trainer._save``). taskfit's checkpoint holds the same files, listed
    in its manifest, and the tokenizer reloads from it."""
    tok = _tokenizer()

    def scenario(m, out):
        model = _causal_lm("llama")
        args = args_for(m, out, max_steps=1, save_strategy="steps", save_steps=1)
        trainer = m.Trainer(model, args, train_dataset=_Rows(), processing_class=tok,
                            data_collator=transformers.default_data_collator)
        built = model.config.pad_token_id
        trainer.train()
        ckpt = os.path.join(out, "checkpoint-1")
        read = {n: _json(os.path.join(ckpt, n)) for n in sorted(os.listdir(ckpt))
                if n.startswith(("tokenizer", "generation_config"))}
        config = _json(os.path.join(ckpt, "config.json"))
        return (built, model.config.pad_token_id, model.generation_config.pad_token_id, config["architectures"],
                config["pad_token_id"]), read

    (hf, hf_files), (tf, tf_files) = both(scenario, tmp_path)
    assert tf == hf == (None, 0, 0, ["LlamaForCausalLM"], 0)
    assert tf_files == hf_files and {"tokenizer.json", "tokenizer_config.json", "generation_config.json"} <= set(hf_files)
    manifest = (tmp_path / "tf" / "checkpoint-1" / "manifest.json").read_text()
    assert all(f'"{name}"' in manifest for name in hf_files)  # listed with size and hash like the other files
    restored = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "tf" / "checkpoint-1"))
    assert restored("in the beginning")["input_ids"] == tok("in the beginning")["input_ids"]
