"""Single-device correctness rows of the GPU proof kit: one small causal LM (a Llama built from a config, SDPA
attention, no dropout) trained through ``Fit`` on a learnable token pattern; every row trains the same seeded model
on the same batches and compares its mean training loss (``TrainOutput.training_loss``, nats) with the ``32-true``
reference row. Run by ``python tests/gpu/kit.py matrix``.
"""

from __future__ import annotations

import importlib.util
import math
import tempfile
from typing import Any

import torch
from kit import Report, Skip, compare


def lm_config(sizes: dict[str, Any], attn: str = "sdpa") -> Any:
    """A ``LlamaConfig`` of the matrix's sizes (vocab, hidden, layers, heads, seq) with attention ``attn``."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=sizes["vocab"], hidden_size=sizes["hidden"], intermediate_size=2 * sizes["hidden"],
                       num_hidden_layers=sizes["layers"], num_attention_heads=sizes["heads"],
                       num_key_value_heads=sizes["heads"], max_position_embeddings=sizes["seq"],
                       attention_dropout=0.0, tie_word_embeddings=False, attn_implementation=attn)


def build_lm(sizes: dict[str, Any], attn: str = "sdpa") -> torch.nn.Module:
    """The seeded (0) ``LlamaForCausalLM`` of :func:`lm_config`."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(lm_config(sizes, attn))


def lm_rows(sizes: dict[str, Any], n: int | None = None, seed: int = 1) -> list[dict[str, torch.Tensor]]:
    """``n`` rows ``{"input_ids", "labels"}`` of ``seq`` int64 tokens: ``(start + i * stride) % vocab`` with a
    random start and stride, so the next token is predictable from the two before it."""
    g = torch.Generator().manual_seed(seed)
    n = n or sizes["batch"] * sizes["steps"]
    vocab, seq = sizes["vocab"], sizes["seq"]
    rows = []
    for _ in range(n):
        start, stride = torch.randint(0, vocab, (2,), generator=g).tolist()
        ids = (start + torch.arange(seq) * (stride % 7 + 1)) % vocab
        rows.append({"input_ids": ids, "labels": ids.clone()})
    return rows


def fit_lm(device: str, sizes: dict[str, Any], model: torch.nn.Module | None = None, trainer: Any = None,
           **overrides: Any) -> tuple[Any, torch.nn.Module, Any]:
    """Train ``model`` (default :func:`build_lm`) for ``steps`` optimizer steps with ``Fit`` (or ``trainer``, a
    ``Fit`` subclass such as ``taskfit.hf.Trainer``); returns ``(fit, model, TrainOutput)``."""
    from taskfit import Fit, FitArguments

    model = model if model is not None else build_lm(sizes)
    kw = {"output_dir": tempfile.mkdtemp(prefix="gpu-kit-"), "max_steps": sizes["steps"], "seed": 0,
          "per_device_train_batch_size": sizes["batch"], "learning_rate": 3e-3, "logging_steps": 1,
          "save_strategy": "no", "report_to": "none", "disable_tqdm": True, "accelerator": device,
          "precision": "32-true"}
    kw.update(overrides)
    fit = (trainer or Fit)(args=FitArguments(**kw))
    out = fit.fit(model, lm_rows(sizes))
    return fit, model, out


def _optimizer_fused(fit: Any) -> Any:
    opt = fit.optimizer
    opt = getattr(opt, "optimizer", opt)
    return opt.defaults.get("fused")


def _step_losses(fit: Any) -> list[float]:
    """The logged loss of every optimizer step (``logging_steps=1``), in order."""
    return [r["loss"] for r in fit.state.log_history if "loss" in r]


def compare_kernels(fit: Any, out: Any, state: dict[str, Any], rtol_first: float = 1e-4, rtol_run: float = 1e-2,
                    **values: Any) -> dict[str, Any]:
    """Another kernel for the same maths (compiled graph, eager attention): the first step's loss, before any
    update, within ``rtol_first`` of the reference's; the run's mean loss within ``rtol_run`` (fp32 rounding in a
    different order grows over the updates: 3.5e-3 measured on the H200 over the matrix's steps)."""
    first = _step_losses(fit)[0]
    rel_first = abs(first - state["ref_first"]) / max(abs(state["ref_first"]), 1e-12)
    row = compare(out.training_loss, state["ref"], rtol_run, first_loss=first, ref_first_loss=state["ref_first"],
                  rel_diff_first=rel_first, rtol_first=rtol_first, **values)
    if rel_first > rtol_first:
        row.update(status="fail", reason=f"first-step loss differs by {rel_first:.3g} (> {rtol_first})")
    return row


def _needs(device: str, *dists: str) -> None:
    if device != "cuda":
        raise Skip("needs a CUDA device")
    for dist in dists:
        if importlib.util.find_spec(dist) is None:
            raise Skip(f"{dist} is not installed (did not travel in gpu-wheels)")


def row_reference(device: str, sizes: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    """``32-true`` with ``optim="adamw_torch"``: the reference loss; on CUDA the optimizer must be the fused
    kernel (the README's claim)."""
    fit, model, out = fit_lm(device, sizes, tf32=False if device == "cuda" else None)
    state["ref"] = out.training_loss
    losses = _step_losses(fit)
    state["ref_first"] = losses[0]
    fused = _optimizer_fused(fit)
    trains = losses[-1] < losses[0]
    ok = trains and (fused is True or device != "cuda")
    return {"status": "pass" if ok else "fail", "loss": out.training_loss, "first_loss": losses[0],
            "last_loss": losses[-1], "optimizer_fused": fused, "param_device": str(next(model.parameters()).device),
            "attn": model.config._attn_implementation}


def row_precision(device: str, sizes: dict[str, Any], state: dict[str, Any], name: str, rtol: float) -> dict:
    """One precision plugin against the reference: loss within ``rtol``; ``16-mixed`` also reports the final loss
    scale and the steps ``GradScaler`` skipped."""
    fit, model, out = fit_lm(device, sizes, precision=name)
    prec = fit.strategy.precision
    values: dict[str, Any] = {"param_dtype": str(next(model.parameters()).dtype).replace("torch.", "")}
    scaler = getattr(prec, "scaler", None)
    if scaler is not None:
        values.update(loss_scale=float(scaler.get_scale()), skipped_steps=getattr(prec, "skipped_steps", None))
    return compare(out.training_loss, state["ref"], rtol, **values)


def row_options(device: str, sizes: dict[str, Any], state: dict[str, Any], rtol: float, **overrides: Any) -> dict:
    """``FitArguments`` ``overrides`` (an optimizer, ``torch_compile``, gradient checkpointing) against the
    reference; reports whether the optimizer is fused and whether gradient checkpointing is on."""
    if overrides.get("torch_compile") and device == "cpu":
        raise Skip("compiling on the CPU takes ~35 s; the GPU run measures this row")
    fit, model, out = fit_lm(device, sizes, **overrides)
    values = {"optimizer": type(getattr(fit.optimizer, "optimizer", fit.optimizer)).__name__,
              "optimizer_fused": _optimizer_fused(fit),
              "grad_ckpt": bool(getattr(model, "is_gradient_checkpointing", False))}
    row = (compare_kernels(fit, out, state, **values) if overrides.get("torch_compile")
           else compare(out.training_loss, state["ref"], rtol, **values))
    if overrides.get("gradient_checkpointing") and not values["grad_ckpt"]:
        row.update(status="fail", reason="gradient checkpointing is not on")
    if overrides.get("optim") == "adamw_torch_fused" and values["optimizer_fused"] is not True:
        row.update(status="fail", reason="optimizer is not fused")
    return row


def row_eager_attention(device: str, sizes: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    """The same model with eager attention: the SDPA reference must match it (same maths, other kernel)."""
    fit, model, out = fit_lm(device, sizes, model=build_lm(sizes, attn="eager"))
    return compare_kernels(fit, out, state, attn=model.config._attn_implementation)


def row_hf_trainer(device: str, sizes: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    """``taskfit.hf.Trainer`` with ``TrainingArguments``, the HF door: the reference loss exactly."""
    from taskfit.hf import Trainer

    _fit, _model, out = fit_lm(device, sizes, trainer=Trainer)
    return compare(out.training_loss, state["ref"], 1e-6)


def row_qlora(device: str, sizes: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    """A 4-bit (NF4, bitsandbytes) base with LoRA adapters (peft) trains: finite losses that go down."""
    _needs(device, "bitsandbytes", "peft")
    from peft import LoraConfig, get_peft_model
    from transformers import BitsAndBytesConfig, LlamaForCausalLM

    folder = tempfile.mkdtemp(prefix="gpu-kit-base-")
    build_lm(sizes).save_pretrained(folder)
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)
    base = LlamaForCausalLM.from_pretrained(folder, quantization_config=quant, device_map={"": 0})
    model = get_peft_model(base, LoraConfig(r=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    fit, _model, out = fit_lm(device, sizes, model=model, learning_rate=1e-2)
    losses = [r["loss"] for r in fit.state.log_history if "loss" in r]
    ok = all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    return {"status": "pass" if ok else "fail", "loss": out.training_loss, "first_loss": losses[0],
            "last_loss": losses[-1], "ref_loss": state["ref"], "trainable": model.get_nb_trainable_parameters()[0]}


def run_part(report: Report, device: str, sizes: dict[str, Any]) -> None:
    """Every matrix row, in order (the reference first)."""
    state: dict[str, Any] = {}
    if report.run("32-true (reference)", row_reference, device, sizes, state)["status"] == "fail" and "ref" not in state:
        return
    for name, rtol in (("bf16-mixed", 0.05), ("16-mixed", 0.05), ("bf16-true", 0.15)):
        report.run(name, row_precision, device, sizes, state, name, rtol)
    report.run("fused AdamW", row_options, device, sizes, state, 1e-3, optim="adamw_torch_fused")
    report.run("torch_compile=True", row_options, device, sizes, state, 1e-3, torch_compile=True)
    report.run("gradient checkpointing", row_options, device, sizes, state, 1e-4, gradient_checkpointing=True)
    report.run("eager attention vs SDPA", row_eager_attention, device, sizes, state)
    report.run("taskfit.hf.Trainer", row_hf_trainer, device, sizes, state)
    for optim, dist in (("adamw_bnb_8bit", "bitsandbytes"), ("adamw_torch_8bit", "torchao")):
        report.run(f"8-bit AdamW ({dist})", _low_bit, device, sizes, state, optim, dist)
    report.run("QLoRA 4-bit base", row_qlora, device, sizes, state)


def _low_bit(device: str, sizes: dict[str, Any], state: dict[str, Any], optim: str, dist: str) -> dict[str, Any]:
    _needs(device, dist)
    return row_options(device, sizes, state, 0.1, optim=optim)
