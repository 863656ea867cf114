"""Differences found by running transformers' own example scripts (run_classification.py, run_clm.py) under
``taskfit.hf`` (tests/peers/run_hf_examples.py), each closed and asserted here with transformers as the oracle:
what a checkpoint folder holds (the processing class, ``config.json``'s ``architectures``) and what its
``trainer_state.json`` records (``eval_steps`` without step evaluation, ``should_log`` after the log row)."""

from __future__ import annotations

import json
import os

import pytest
import torch

from common import RegressionDataset, RegressionModel, args_for, both

transformers = pytest.importorskip("transformers")


def _tokenizer():
    """A real fast tokenizer built here (word-level over a few words; nothing downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "in", "the", "beginning", "god", "created", "heaven"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                                                model_max_length=8)


class _Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 16) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(2, 8, (n, 6), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(6, dtype=torch.long), "labels": self.labels[i]}


def _headless_config_model():
    """A sequence classifier whose config still names the headless class it was loaded from, as
    ``AutoModelForSequenceClassification.from_pretrained`` of a ``BertModel`` folder leaves it."""
    config = transformers.BertConfig(vocab_size=8, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=16, max_position_embeddings=8, num_labels=2,
                                     architectures=["BertModel"])
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(config)


def test_checkpoint_holds_processing_class_and_saving_class_name(tmp_path):
    """HF ``Trainer._save`` writes the processing class into every checkpoint and ``save_pretrained`` records the
    model's own class in ``config.json``; taskfit's checkpoint does both (its manifest lists the tokenizer files)."""
    tok = _tokenizer()

    def scenario(m, out):
        args = args_for(m, out, max_steps=2, save_strategy="steps", save_steps=2, logging_steps=1)
        m.Trainer(_headless_config_model(), args, train_dataset=_Tokens(), processing_class=tok,
                  data_collator=transformers.default_data_collator).train()
        ckpt = os.path.join(out, "checkpoint-2")
        files = sorted(os.listdir(ckpt))
        with open(os.path.join(ckpt, "config.json")) as f:
            architectures = json.load(f)["architectures"]
        tokenizer_files = {n: json.load(open(os.path.join(ckpt, n))) for n in files if n.startswith("tokenizer")}
        return files, architectures, tokenizer_files

    (hf_files, hf_arch, hf_tok), (tf_files, tf_arch, tf_tok) = both(scenario, tmp_path)
    assert hf_arch == tf_arch == ["BertForSequenceClassification"]
    assert hf_tok and tf_tok == hf_tok
    assert {n for n in hf_files if n.startswith("tokenizer")} <= set(tf_files)
    manifest = json.load(open(tmp_path / "tf" / "checkpoint-2" / "manifest.json"))
    assert set(hf_tok) <= set(json.dumps(manifest).split('"'))  # every tokenizer file is listed with its hash
    restored = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "tf" / "checkpoint-2"))
    assert restored("in the beginning")["input_ids"] == tok("in the beginning")["input_ids"]


@pytest.mark.parametrize("eval_strategy", ["no", "steps"])
def test_trainer_state_eval_steps_and_control_flags_at_a_save(tmp_path, eval_strategy):
    """A checkpoint's ``trainer_state.json`` records ``eval_steps`` as HF does (TrainerState's 500 unless
    evaluation runs on steps, then ``logging_steps``) and the control flags of the save point: ``should_log`` is
    False once the step's row is logged (HF's ``on_log`` clears it), ``should_save`` True."""

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
    assert hf[0] == (500 if eval_strategy == "no" else 2) and hf[1]["should_log"] is False


def _causal_lm(kind: str):
    torch.manual_seed(0)
    if kind == "gpt2":
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(  # no dropout: the loss is deterministic
            vocab_size=8, n_embd=8, n_layer=1, n_head=2, n_positions=8, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0))
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=8, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=8, bos_token_id=2, eos_token_id=3))


def test_trainer_aligns_the_tokenizers_special_tokens_into_the_model_config(tmp_path):
    """HF's ``train()`` writes the pad token id a tokenizer defines into a config without one (and its generation
    config) before training, so run_clm.py's saved config.json has it; building the Trainer changes nothing yet.
    taskfit.hf.Trainer does the same."""

    def scenario(m, out):
        model = _causal_lm("llama")
        trainer = m.Trainer(model, args_for(m, out, max_steps=1), train_dataset=_Rows(), processing_class=_tokenizer(),
                            data_collator=transformers.default_data_collator)
        built = model.config.pad_token_id
        trainer.train()
        return built, model.config.pad_token_id, model.generation_config.pad_token_id, model.config.eos_token_id

    hf, tf = both(scenario, tmp_path)
    assert tf == hf and hf[:3] == (None, 0, 0)


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


def test_checkpoint_of_a_generative_model_holds_its_generation_config(tmp_path):
    """HF's ``save_pretrained`` writes ``generation_config.json`` next to a generative model's weights in every
    checkpoint; taskfit's checkpoint holds the same file (same JSON)."""

    def scenario(m, out):
        args = args_for(m, out, max_steps=1, save_strategy="steps", save_steps=1)
        m.Trainer(_causal_lm("llama"), args, train_dataset=_Rows(),
                  data_collator=transformers.default_data_collator).train()
        with open(os.path.join(out, "checkpoint-1", "generation_config.json")) as f:
            return json.load(f)

    hf, tf = both(scenario, tmp_path)
    assert tf == hf and hf["eos_token_id"] == 3
