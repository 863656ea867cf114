"""F-LOOP-4: the layer-wise GaLore / APOLLO optimizers (``optim="galore_adamw_layerwise"``,
``"galore_adamw_8bit_layerwise"``, ``"galore_adafactor_layerwise"``, ``"apollo_adamw_layerwise"``): one optimizer
and one LR schedule per parameter, stepped inside backward by post-accumulate-grad hooks. The same script under
``transformers.Trainer`` and ``taskfit.hf.Trainer`` (only the import changed) trains to the same weights (exact,
fp32 CPU) and logs the same ``log_history`` (loss, ``learning_rate``, ``grad_norm`` 0.0: the hooks leave no
gradient to clip) and ``TrainOutput``; what HF refuses is refused before training; taskfit resumes its own
layer-wise checkpoints exactly and refuses transformers' (which hold no per-parameter state).

transformers 5.23 differs in three places, each asserted in ``test_transformers_layer_wise_quirks`` and
documented in docs/hf.md:

* it builds the LR schedule over accelerate's wrapper of its placeholder optimizer, so ``get_scheduler`` never
  takes its layer-wise branch: every parameter's optimizer trains at the constant ``learning_rate`` while the log
  shows the schedule. With a constant schedule transformers runs unchanged here; with warmup + linear decay the
  HF run gets the shim :func:`_scheduled_as_hf_intends` (its own layer-wise ``get_scheduler`` branch, reached by
  unwrapping the optimizer);
* that branch's ``LayerWiseDummyScheduler.get_lr`` returns one rate per parameter for a one-group placeholder,
  which this torch's ``LRScheduler`` (a strict ``zip``) refuses for more than one parameter: the shim keeps the
  first rate, what earlier torch releases did;
* its ``galore_adafactor_layerwise`` builds ``GaLoreAdafactor(lr=...)`` with the default ``relative_step=True``,
  which GaLore refuses: the HF run gets ``scale_parameter=False, relative_step=False``, as HF's own
  ``galore_adafactor`` and taskfit's ``galore_adafactor_layerwise`` do.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers.Trainer needs it

from common import args_for, assert_same, hf_names, summary, weights  # noqa: E402
from test_optimizers_diff import LOW_RANK, MLP, Data  # noqa: E402

from taskfit import FitArguments  # noqa: E402
from taskfit.io import CheckpointError  # noqa: E402
from taskfit.optim.optimizers import create_optimizer  # noqa: E402

NAMES = ("galore_adamw_layerwise", "galore_adamw_8bit_layerwise", "galore_adafactor_layerwise",
         "apollo_adamw_layerwise")
#: 6 steps over 2 epochs of 4 batches, warmup 2 then linear decay, one log row per step, HF's clipping (1.0)
RUN = dict(max_steps=6, learning_rate=0.01, logging_steps=1, warmup_steps=2, lr_scheduler_type="linear",
           **LOW_RANK)


def _package(name: str) -> None:
    module = "apollo_torch" if name.startswith("apollo") else "galore_torch"
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"optim={name!r} needs {module}, which is not installed")


def _adafactor_as_hf_intends(mp: pytest.MonkeyPatch) -> None:
    import galore_torch

    original = galore_torch.GaLoreAdafactor
    mp.setattr(galore_torch, "GaLoreAdafactor",
               lambda params, **kw: original(params, **{"scale_parameter": False, "relative_step": False, **kw}))


def _scheduled_as_hf_intends(mp: pytest.MonkeyPatch) -> None:
    """transformers' own layer-wise schedule: ``create_scheduler`` gets the placeholder optimizer instead of
    accelerate's wrapper (the RNG state is kept: the real run builds no second placeholder), and the placeholder
    schedule keeps one rate per group."""
    from transformers import Trainer
    from transformers.trainer_pt_utils import LayerWiseDummyScheduler

    create, get_lr = Trainer.create_scheduler, LayerWiseDummyScheduler.get_lr

    def create_scheduler(self, num_training_steps, optimizer=None):
        rng = torch.get_rng_state()
        try:
            return create(self, num_training_steps, optimizer or getattr(self.optimizer, "optimizer", None))
        finally:
            torch.set_rng_state(rng)
    mp.setattr(Trainer, "create_scheduler", create_scheduler)
    mp.setattr(LayerWiseDummyScheduler, "get_lr", lambda self: get_lr(self)[:len(self.optimizer.param_groups)])


def _train(which: str, out: str, name: str, resume: str | None = None, **kw) -> dict:
    m = hf_names(which)
    m.set_seed(42)
    t = m.Trainer(model=MLP(), args=args_for(m, out, **{**RUN, "optim": name, **kw}), train_dataset=Data())
    result = t.train(resume_from_checkpoint=resume)
    return {**summary(t, result), "trainer": t}


def _hf(tmp_path: Path, name: str, scheduled: bool = False, fix_adafactor: bool = True, **kw) -> dict:
    with pytest.MonkeyPatch.context() as mp:
        if scheduled:
            _scheduled_as_hf_intends(mp)
        if fix_adafactor and name == "galore_adafactor_layerwise":
            _adafactor_as_hf_intends(mp)
        return _train("hf", str(tmp_path / f"hf-{scheduled}"), name, **kw)


def _compare(hf: dict, tf: dict) -> None:
    rows = [r for r in hf["log_history"] if "loss" in r]
    assert len(rows) == 6 and [r["grad_norm"] for r in rows] == [0.0] * 6  # no gradient is left to clip
    hf, tf = dict(hf), dict(tf)
    hf.pop("trainer"), tf.pop("trainer")
    assert_same(hf, tf)
    start = weights(MLP())
    assert all(not torch.equal(start[k], v) for k, v in tf["weights"].items())  # every parameter trained


CASES = [n for n in NAMES if "8bit" not in n]  # galore_adamw_8bit_layerwise needs CUDA


# ---------------------------------------------------------------------------------------------- differential
@pytest.mark.parametrize("name", CASES)
def test_f_loop_4_layer_wise_constant_lr_as_transformers_unchanged(name, tmp_path):
    """A constant learning rate: transformers.Trainer as it is (the adafactor form with its fix) and taskfit train
    four parameters, two of them GaLore / APOLLO targets, to the same weights (exact), log history and
    TrainOutput; the loop holds the no-op placeholder optimizer and schedule."""
    from taskfit.optim.layerwise import LayerWiseOptimizer, LayerWiseScheduler

    _package(name)
    constant = {"lr_scheduler_type": "constant", "warmup_steps": 0}
    hf = _hf(tmp_path, name, **constant)
    tf = _train("tf", str(tmp_path / "tf"), name, **constant)
    t = tf["trainer"]
    assert type(t.optimizer) is LayerWiseOptimizer and type(t.lr_scheduler) is LayerWiseScheduler
    assert len(t.optimizer.optimizer_dict) == 4
    _compare(hf, tf)


@pytest.mark.parametrize("name", CASES)
def test_f_loop_4_layer_wise_schedule_as_transformers(name, tmp_path):
    """Warmup + linear decay, each parameter's own schedule stepped in its hook: the same weights (exact), log
    history (the ``learning_rate`` each step used) and TrainOutput as transformers' layer-wise schedule."""
    _package(name)
    hf = _hf(tmp_path, name, scheduled=True)
    tf = _train("tf", str(tmp_path / "tf"), name)
    assert len({r["learning_rate"] for r in tf["log_history"] if "loss" in r}) == 5  # 0, warmup, then decay
    _compare(hf, tf)


def test_transformers_layer_wise_quirks(tmp_path):
    """What the shims fix, asserted so that a transformers release that changes them shows up here: unshimmed,
    transformers logs the warmup + linear schedule but trains every parameter at the constant rate (the weights of
    taskfit's constant-rate run); its placeholder schedule refuses several parameters; its layer-wise Adafactor
    is refused when built."""
    from transformers import get_scheduler
    from transformers.trainer_pt_utils import LayerWiseDummyOptimizer

    _package("galore_adafactor_layerwise")
    hf = _hf(tmp_path, "galore_adamw_layerwise")
    tf = _train("tf", str(tmp_path / "tf"), "galore_adamw_layerwise", lr_scheduler_type="constant", warmup_steps=0)
    assert [r["learning_rate"] for r in hf["log_history"] if "loss" in r][:3] == [0.0, 0.005, 0.01]
    assert_same(hf["weights"], tf["weights"])
    model = MLP()
    placeholder = LayerWiseDummyOptimizer({p: torch.optim.SGD([p], lr=0.1) for p in model.parameters()}, lr=0.1)
    with pytest.raises(ValueError, match="zip"):
        get_scheduler("linear", placeholder, num_warmup_steps=2, num_training_steps=6)
    with pytest.raises(ValueError, match="Cannot combine manual `lr` and `relative_step=True`"):
        _hf(tmp_path, "galore_adafactor_layerwise", fix_adafactor=False)


def test_f_loop_4_galore_8bit_layer_wise_needs_cuda():
    """``galore_adamw_8bit_layerwise`` steps through bitsandbytes' CUDA kernels: on CPU parameters it is refused
    when built (under transformers the first backward fails)."""
    _package("galore_adamw_8bit_layerwise")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the refusal is for CPU parameters")
    with pytest.raises(ValueError, match=r"optim='galore_adamw_8bit_layerwise' needs CUDA parameters .* use "
                                         r"galore_adamw_layerwise"):
        create_optimizer(MLP(), FitArguments(optim="galore_adamw_8bit_layerwise", optim_target_modules=["up"]))


# ------------------------------------------------------------------------------------------------ refusals
def test_f_loop_4_layer_wise_refusals_before_training(tmp_path):
    """HF's refusals with HF's error types, before any step: gradient accumulation (ValueError, both trainers);
    and taskfit's own: ``reduce_lr_on_plateau`` (a per-parameter schedule in a backward hook has no metric; under
    transformers the first backward fails)."""
    _package("galore_adamw_layerwise")
    for which in ("hf", "tf"):
        m = hf_names(which)
        t = m.Trainer(model=MLP(), args=args_for(m, str(tmp_path / which), **{
            **RUN, "optim": "galore_adamw_layerwise", "gradient_accumulation_steps": 2}), train_dataset=Data())
        with pytest.raises(ValueError, match="does not support gradient accumulation"):
            t.train()
        assert t.state.global_step == 0
    m = hf_names("tf")
    t = m.Trainer(model=MLP(), args=args_for(m, str(tmp_path / "plateau"), **{
        **RUN, "optim": "galore_adamw_layerwise", "lr_scheduler_type": "reduce_lr_on_plateau", "eval_strategy": "steps",
        "eval_steps": 3}), train_dataset=Data(), eval_dataset=Data(16))
    with pytest.raises(ValueError, match="lr_scheduler_type='reduce_lr_on_plateau' steps with an evaluation metric"):
        t.train()
    assert t.state.global_step == 0


_DDP_JOB = """
import sys
import torch
import taskfit.hf as m
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 1)
    def forward(self, input_x, labels=None):
        y = self.lin(input_x).squeeze(-1)
        return (y,) if labels is None else (nn.functional.mse_loss(y, labels), y)

data = [{"input_x": torch.randn(4), "labels": torch.randn(())} for _ in range(16)]
args = m.TrainingArguments(output_dir=sys.argv[1], optim="galore_adamw_layerwise", optim_target_modules=["lin"],
                           max_steps=2, per_device_train_batch_size=4, report_to="none", use_cpu=True,
                           save_strategy="no", disable_tqdm=True)
m.Trainer(model=Net(), args=args, train_dataset=data, strategy="ddp", devices=2).train()
"""


@pytest.mark.slow
@pytest.mark.distributed
def test_f_loop_4_layer_wise_refuses_several_processes(tmp_path):
    """Two gloo processes (DDP): refused before training with HF's error type (NotImplementedError; HF: "does
    not support DDP")."""
    _package("galore_adamw_layerwise")
    job = tmp_path / "job.py"
    job.write_text(_DDP_JOB)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                          "MASTER_PORT", "TASKFIT_LAUNCHED")}
    proc = subprocess.run([sys.executable, str(job), str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=300, env={**env, "OMP_NUM_THREADS": "1"}, cwd=tmp_path)
    assert proc.returncode != 0
    assert "NotImplementedError: Layer-wise galore_adamw_layerwise does not support distributed training" in \
        proc.stderr, proc.stderr[-3000:]
    assert "'loss'" not in proc.stdout


# ---------------------------------------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("name", ["galore_adamw_layerwise", "apollo_adamw_layerwise", "galore_adamw", "apollo_adamw"])
def test_f_loop_4_layer_wise_resume_is_exact(name, tmp_path):
    """A run resumed from its step-3 checkpoint (every parameter's optimizer state, GaLore / APOLLO projectors
    included, and schedule; loaded with weights_only=True) ends at the same weights and log history as the run
    that never stopped. The one-optimizer forms too: their projectors are written as plain attributes as well
    (pickled objects would need weights_only=False to resume)."""
    _package(name)
    full = _train("tf", str(tmp_path / "full"), name, save_strategy="steps", save_steps=3)
    ckpt = tmp_path / "full" / "checkpoint-3"
    assert (ckpt / "optimizer.pt").exists()
    resumed = _train("tf", str(tmp_path / "resumed"), name, resume=str(ckpt))
    assert_same(full["weights"], resumed["weights"])
    assert_same([r for r in full["log_history"] if "loss" in r], [r for r in resumed["log_history"] if "loss" in r])


def test_f_loop_4_layer_wise_checkpoints_across_the_two_libraries(tmp_path):
    """transformers saves only the placeholder optimizer of a layer-wise run (resuming there restarts every
    parameter's optimizer and schedule): taskfit refuses such a checkpoint, naming why, before training. The other
    way, transformers resumes from taskfit's layer-wise checkpoint (with fresh per-parameter optimizers, as from
    its own) and runs to the end."""
    _package("galore_adamw_layerwise")
    _hf(tmp_path, "galore_adamw_layerwise", save_strategy="steps", save_steps=3, max_steps=3)
    m = hf_names("tf")
    t = m.Trainer(model=MLP(), args=args_for(m, str(tmp_path / "tf"), **{**RUN, "optim": "galore_adamw_layerwise"}),
                  train_dataset=Data())
    with pytest.raises(CheckpointError, match="holds no per-parameter optimizer states"):
        t.train(resume_from_checkpoint=str(tmp_path / "hf-False" / "checkpoint-3"))
    assert t.state.global_step == 0
    _train("tf", str(tmp_path / "tf-saved"), "galore_adamw_layerwise", save_strategy="steps", save_steps=3)
    hf = _train("hf", str(tmp_path / "hf-resumed"), "galore_adamw_layerwise",
                resume=str(tmp_path / "tf-saved" / "checkpoint-3"))
    assert hf["global_step"] == 6 and len([r for r in hf["log_history"] if "loss" in r]) == 6


def test_f_loop_4_layer_wise_second_fit_replaces_the_hooks(tmp_path):
    """Training the same model twice: the second run's per-parameter optimizers replace the first's hooks, so
    each parameter is stepped once per backward (the first run's optimizers stay at their last step)."""
    _package("galore_adamw_layerwise")
    m = hf_names("tf")
    t = m.Trainer(model=MLP(), args=args_for(m, str(tmp_path), **{**RUN, "optim": "galore_adamw_layerwise"}),
                  train_dataset=Data())
    t.train()
    first = t.optimizer
    t.train()
    assert t.optimizer is not first
    for run in (first, t.optimizer):
        assert [o.state[p]["step"] for p, o in run.optimizer_dict.items()] == [6] * 4


@pytest.mark.parametrize("named", ["builtins:dict", "galore_torch.adamw:torch.nn.Module", "galore_torch.adamw:math"])
def test_f_loop_4_layer_wise_state_names_only_optimizer_classes(named):
    """The per-parameter state restores objects (GaLore / APOLLO projectors) only from classes defined in those
    packages: any other name in the file is refused (the file loads with weights_only=True, and stays safe)."""
    _package("galore_adamw_layerwise")
    from taskfit.optim.layerwise import _OBJECT_KEY

    opt = create_optimizer(MLP(), FitArguments(optim="galore_adamw_layerwise", optim_target_modules=["up"]))
    state = opt.state_dict()
    state["layerwise"][0]["state"] = {0: {"projector": {_OBJECT_KEY: named, "attributes": {}}}}
    with pytest.raises(CheckpointError, match="optimizer.pt names"):
        opt.load_state_dict(state)
