"""Your own training loop on taskfit's `Engine`: the single-GPU efficiency guide's final loop, which combines
micro-batches of 1 with gradient accumulation over 4, gradient checkpointing, bf16 mixed precision and 8-bit Adam
from bitsandbytes, here fine-tuning all-MiniLM-L6-v2 on the election tweets of
`finetune_text_classifier.py` (same data and weights, shipped inside installed packages; nothing is downloaded).

Written for the Engine instead of Accelerate: `engine.setup` replaces `accelerator.prepare`, `engine.backward`
replaces `accelerator.backward`, and `engine.no_backward_sync` skips the gradient all-reduce on the first 3
micro-batches of each window when the same script runs on several processes (`--strategy ddp --devices 2`).
The loop ends with `engine.save`, a checkpoint in taskfit's format that `Fit(resume_from_checkpoint=...)` and
`engine.load` both read.

Run (one process on the CPU, bf16 autocast; about 1 s per optimizer step on 2 cores):
    python examples/own_loop.py [--max-steps 20] [--output-dir runs/own_loop] [--strategy ddp --devices 2]
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: never try the hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import argparse
import pathlib
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from finetune_text_classifier import build_module, load_data  # noqa: E402  (the sibling example's data)

from taskfit import Engine  # noqa: E402


def adam_8bit(model: nn.Module, lr: float, weight_decay: float = 0.0, betas=(0.9, 0.999), eps: float = 1e-8):
    """`bitsandbytes.optim.Adam8bit` over two groups, as the guide builds it: weight decay for every weight but
    biases and LayerNorm parameters. Raises ModuleNotFoundError naming the package when bitsandbytes is absent."""
    try:
        import bitsandbytes as bnb
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError("examples/own_loop.py needs bitsandbytes for 8-bit Adam: "
                                  "pip install 'taskfit[bnb]'") from exc
    from taskfit.optim.optimizers import get_decay_parameter_names

    decay = set(get_decay_parameter_names(model))
    groups = [{"params": [p for n, p in model.named_parameters() if n in decay], "weight_decay": weight_decay},
              {"params": [p for n, p in model.named_parameters() if n not in decay], "weight_decay": 0.0}]
    return bnb.optim.Adam8bit(groups, lr=lr, betas=betas, eps=eps)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output-dir", default="runs/own_loop")
    p.add_argument("--max-steps", type=int, default=20, help="optimizer steps (windows of 4 micro-batches)")
    p.add_argument("--train-size", type=int, default=500)
    p.add_argument("--eval-size", type=int, default=64)
    p.add_argument("--learning-rate", type=float, default=5e-5)
    p.add_argument("--accumulation", type=int, default=4)
    p.add_argument("--strategy", default="auto")
    p.add_argument("--devices", default="1")
    p.add_argument("--precision", default="bf16-mixed")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


@torch.no_grad()
def evaluate(engine: Engine, model, loader) -> float:
    """Mean cross-entropy over ``loader`` (averaged over processes)."""
    model.eval()
    total, count = torch.zeros(()), 0
    for batch in loader:
        total += model(**batch).loss.float() * len(batch["labels"])
        count += len(batch["labels"])
    model.train()
    return float(engine.all_reduce(total / max(count, 1)))


def main(argv=None) -> dict:
    a = parse_args(argv)
    devices = int(a.devices) if a.devices.isdigit() else a.devices
    engine = Engine(accelerator="cpu" if not torch.cuda.is_available() else "auto", strategy=a.strategy,
                    devices=devices, precision=a.precision)
    engine.launch()
    engine.seed_everything(a.seed)
    with engine.rank_zero_first():  # tokenizing once per machine would do; here every process reads the package
        data = load_data(train_size=a.train_size, test_size=a.eval_size, val_size=1, seed=a.seed)
    model = build_module(seed=a.seed).model  # the plain HF AutoModelForSequenceClassification
    # the guide's gradient_checkpointing_enable(), under its newer transformers name where that exists
    getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
    optimizer = adam_8bit(model, a.learning_rate)
    model, optimizer = engine.setup(model, optimizer)
    loader = engine.setup_dataloaders(DataLoader(data.train, batch_size=1, shuffle=True))
    eval_loader = engine.setup_dataloaders(DataLoader(data.test, batch_size=32))

    eval_before = evaluate(engine, model, eval_loader)
    model.train()
    losses, window, step = [], torch.zeros(()), 0
    while step < a.max_steps:
        for i, batch in enumerate(loader, start=1):
            last = i % a.accumulation == 0
            with engine.no_backward_sync(model, enabled=not last):
                loss = model(**batch).loss / a.accumulation
                engine.backward(loss)
            window += loss.detach().float()
            if not last:
                continue
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            losses.append(window.clone())
            window.zero_()
            if step >= a.max_steps:
                break
    losses = [float(v) for v in engine.all_reduce(torch.stack(losses))]  # one host sync, after the loop
    eval_after = evaluate(engine, model, eval_loader)
    ckpt = os.path.join(a.output_dir, f"checkpoint-{step}")
    engine.save(ckpt, {"model": model, "optimizer": optimizer, "step": step})
    engine.print(f"{step} optimizer steps of {a.accumulation} micro-batches: train loss {losses[0]:.3f} -> "
                 f"{losses[-1]:.3f}, held-out loss {eval_before:.3f} -> {eval_after:.3f}; checkpoint in {ckpt}")
    return {"engine": engine, "model": model, "optimizer": optimizer, "losses": losses, "checkpoint": ckpt,
            "eval_before": eval_before, "eval_after": eval_after, "steps": step}


if __name__ == "__main__":
    main()
