"""F-LOOP-4: optimizers by HF ``optim`` name with HF's semantics. The same script trains under
``transformers.Trainer`` and ``taskfit.hf.Trainer`` (only the import changed) to the same weights, exactly in fp32
on the CPU, for every HF name whose package is installed here; names taskfit cannot build fail before any work
with the reason, and a missing package's error names the extra to install."""

import importlib.util
import os

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers.Trainer needs it

from taskfit import FitArguments  # noqa: E402
from taskfit.optim.construct import require  # noqa: E402
from taskfit.optim.hf_optimizers import EXTRAS, UNSUPPORTED  # noqa: E402
from taskfit.optim.optimizers import create_optimizer  # noqa: E402

from common import assert_same, hf_names, weights  # noqa: E402


class MLP(nn.Module):
    """Two linear layers (GaLore/APOLLO target ``nn.Linear`` weights) with an MSE loss, HF's model calling shape."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 1)

    def forward(self, input_x: torch.Tensor, labels: torch.Tensor | None = None):
        y = self.down(torch.tanh(self.up(input_x))).squeeze(-1)
        return (y,) if labels is None else (nn.functional.mse_loss(y, labels), y)


class Data(torch.utils.data.Dataset):
    def __init__(self, n: int = 32) -> None:
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, 8, generator=g)
        self.y = self.x.sum(-1) * 0.5 + 0.1 * torch.randn(n, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"input_x": self.x[i], "labels": self.y[i]}


def _train(which: str, out: str, optim: str, **kw) -> dict:
    m = hf_names(which)
    args = m.TrainingArguments(output_dir=os.path.join(out, which), optim=optim, max_steps=4, learning_rate=0.01,
                               per_device_train_batch_size=8, report_to="none", use_cpu=True, save_strategy="no",
                               disable_tqdm=True, logging_steps=2, seed=42, **kw)
    trainer = m.Trainer(model=MLP(), args=args, train_dataset=Data())
    trainer.train()
    return {"weights": weights(trainer.model), "type": type(trainer.optimizer).__name__ if not hasattr(
        trainer.optimizer, "optimizer") else type(trainer.optimizer.optimizer).__name__,
        "losses": [r["loss"] for r in trainer.state.log_history if "loss" in r]}


def _installed(name: str) -> bool:
    module = {"hf": "transformers", "galore": "galore_torch", "apollo": "apollo_torch", "grokadamw": "grokadamw",
              "schedulefree": "schedulefree", "optimi": "optimi", "torchao": "torchao",
              "lomo": "lomo_optim"}[EXTRAS[name]]
    return importlib.util.find_spec(module) is not None


#: cheap ones run by default; the others (slower packages) under `slow`
DEFAULT_RUN = ("adafactor", "schedule_free_adamw", "grokadamw")
LOW_RANK = {"optim_target_modules": ["up", "down"], "optim_args": "rank=2,update_proj_gap=2"}
CASES = [pytest.param(n, marks=() if n in DEFAULT_RUN else pytest.mark.slow) for n in sorted(EXTRAS)
         if not n.endswith("_layerwise")]  # one optimizer per parameter: test_layerwise_optim.py


@pytest.mark.parametrize("name", CASES)
def test_f_loop_4_same_weights_as_transformers(name, tmp_path):
    """Same optimizer class, same weights and logged losses as transformers.Trainer after 4 steps (exact)."""
    if not _installed(name):
        pytest.skip(f"the package of optim={name!r} is not installed (extra {EXTRAS[name]!r})")
    if name == "galore_adamw_8bit" and not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs CUDA parameters"):  # under HF its first step fails on CUDA calls
            create_optimizer(MLP(), FitArguments(optim=name, optim_target_modules=["up"]))
        return
    if name == "adalomo" and not torch.cuda.is_available():  # lomo-optim puts AdaLomo's state on the GPU
        with pytest.raises(ValueError, match="needs a CUDA device"):
            create_optimizer(MLP(), FitArguments(optim=name))
        return
    kw = dict(LOW_RANK) if name.startswith(("galore", "apollo")) else {}
    if name.startswith("schedule_free"):
        kw.update(warmup_steps=2, eval_strategy="steps", eval_steps=2)  # eval() / train() switches as HF
    hf_kw, tf_kw = dict(kw), dict(kw)
    if "eval_strategy" in kw:
        results = []
        for which in ("hf", "tf"):
            m = hf_names(which)
            args = m.TrainingArguments(output_dir=str(tmp_path / which), optim=name, max_steps=4, learning_rate=0.01,
                                       per_device_train_batch_size=8, report_to="none", use_cpu=True,
                                       save_strategy="no", disable_tqdm=True, logging_steps=2, seed=42, **kw)
            trainer = m.Trainer(model=MLP(), args=args, train_dataset=Data(), eval_dataset=Data(16))
            trainer.train()
            results.append({"weights": weights(trainer.model),
                            "eval": [r["eval_loss"] for r in trainer.state.log_history if "eval_loss" in r]})
        assert_same(results[0], results[1])
        return
    hf, tf = _train("hf", str(tmp_path), name, **hf_kw), _train("tf", str(tmp_path), name, **tf_kw)
    assert_same(hf, tf)


def test_f_loop_4_adafactor_is_transformers_adafactor():
    """optim='adafactor' is transformers.optimization.Adafactor with HF's arguments (not torch.optim.Adafactor)."""
    from transformers.optimization import Adafactor

    opt = create_optimizer(MLP(), FitArguments(optim="adafactor", learning_rate=0.01, weight_decay=0.1))
    assert type(opt) is Adafactor
    assert {k: opt.defaults[k] for k in ("lr", "scale_parameter", "relative_step", "warmup_init")} == {
        "lr": 0.01, "scale_parameter": False, "relative_step": False, "warmup_init": False}
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_f_loop_4_unsupported_names_say_why(name):
    with pytest.raises(NotImplementedError, match=rf"optim='{name}' is not supported by taskfit: "):
        create_optimizer(MLP(), FitArguments(optim=name))


def test_f_loop_4_missing_package_names_the_extra():
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'taskfit\[galore\]'"):
        require("taskfit_no_such_module", "galore-torch", "galore", "galore_adamw")


def test_f_loop_4_low_rank_needs_target_modules():
    pytest.importorskip("galore_torch")
    with pytest.raises(ValueError, match="needs optim_target_modules"):
        create_optimizer(MLP(), FitArguments(optim="galore_adamw"))
    with pytest.raises(ValueError, match="no nn.Linear module matches"):
        create_optimizer(MLP(), FitArguments(optim="galore_adamw", optim_target_modules=["nothing"]))
    with pytest.raises(TypeError, match=r"optim_args \['bogus'\] are not read by optim='galore_adamw'"):
        create_optimizer(MLP(), FitArguments(optim="galore_adamw", optim_target_modules=["up"],
                                             optim_args="bogus=1"))
