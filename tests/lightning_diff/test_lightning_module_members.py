"""LightningModule members on every TaskModule, the same module body under Lightning and under taskfit (the
scenarios follow Lightning's tests_pytorch/core/test_lightning_module.py): ranks, the trainer reference, freezing,
TorchScript and ONNX export, all_gather, toggle_optimizer, rank-0 print and Lightning Fabric (F-LIT-1)."""

from __future__ import annotations

import importlib.util
import types
import warnings

import pytest
import torch
from harness import data, linear


def _bases():
    import lightning
    import taskfit.lightning

    return {"lightning": lightning, "taskfit": taskfit.lightning}


def model(L):
    class Net(linear(L.LightningModule)):
        def forward(self, x):
            return torch.tanh(self.layer(x))
    torch.manual_seed(0)
    return Net()


def test_F_LIT_1_detached_members_and_trainer_reference():
    """Detached: ranks, step, epoch 0, no logger, fabric None, self.trainer raises naming the `Trainer`; a trainer
    object assigned to ``module.trainer`` is read for the ranks, step and epoch and reaches inner modules."""
    seen = {}
    for name, L in _bases().items():
        m = model(L)
        detached = (m.global_rank, m.local_rank, m.global_step, m.current_epoch, m.logger, m.loggers, m.fabric)
        with pytest.raises(RuntimeError, match="attached to a `Trainer"):
            _ = m.trainer
        inner = L.LightningModule()
        m.inner = inner
        stand_in = types.SimpleNamespace(global_rank=3, local_rank=1, global_step=123, current_epoch=7,
                                         logger="lg", loggers=["lg"])
        m.trainer = stand_in
        attached = (m.global_rank, m.local_rank, m.global_step, m.current_epoch, m.logger, m.loggers,
                    inner.trainer is stand_in, m._trainer is stand_in)
        seen[name] = (detached, attached)
    assert seen["taskfit"] == seen["lightning"] == (
        (0, 0, 0, 0, None, [], None), (3, 1, 123, 7, "lg", ["lg"], True, True))


def test_F_LIT_1_freeze_unfreeze():
    """freeze(): no parameter requires grad, eval mode, returns the module; unfreeze() the reverse."""
    seen = {}
    for name, L in _bases().items():
        m = model(L)
        frozen = m.freeze()
        a = (frozen is m, m.training, [p.requires_grad for p in m.parameters()])
        m.unfreeze()
        seen[name] = (a, (m.training, [p.requires_grad for p in m.parameters()]))
    assert seen["taskfit"] == seen["lightning"] == ((True, False, [False, False]), (True, [True, True]))


@pytest.mark.parametrize("method", ["script", "trace"])
def test_F_LIT_1_to_torchscript_same_outputs(method, tmp_path):
    """to_torchscript (script, and trace from example_input_array) gives a module computing the same outputs,
    keeps the module's train mode and saves a loadable file; scripting works with a trainer attached."""
    x = torch.randn(3, 4)
    out = {}
    for name, L in _bases().items():
        m = model(L)
        m.example_input_array = torch.zeros(2, 4)
        if method == "script":  # (Lightning's tracing of a module with an unused trainer attached fails)
            m.trainer = L.Trainer(logger=False, enable_progress_bar=False, default_root_dir=str(tmp_path / name))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Lightning 2.7 deprecates TorchScript export
            scripted = m.to_torchscript(file_path=tmp_path / f"{name}.pt", method=method)
        assert m.training
        out[name] = (scripted(x), torch.jit.load(str(tmp_path / f"{name}.pt"))(x), m(x))
    for a, b in zip(out["lightning"], out["taskfit"]):
        assert torch.equal(a, b)
    assert torch.equal(out["taskfit"][0], out["taskfit"][2])


def test_F_LIT_1_to_torchscript_bad_method_and_to_onnx_without_onnx(tmp_path):
    """An unknown method raises the same ValueError; to_onnx without the onnx package raises Lightning's
    ModuleNotFoundError naming it; without an input it raises the same ValueError."""
    errors = {}
    for name, L in _bases().items():
        m = model(L)
        with pytest.raises(ValueError) as bad, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m.to_torchscript(method="compile")
        if importlib.util.find_spec("onnx") is None:
            with pytest.raises(ModuleNotFoundError) as onnx:
                m.to_onnx(tmp_path / "m.onnx")
        else:
            with pytest.raises(ValueError) as onnx:
                m.to_onnx(tmp_path / "m.onnx")
        errors[name] = (str(bad.value), str(onnx.value).replace("Net", "<cls>"))
    assert errors["taskfit"] == errors["lightning"]
    if importlib.util.find_spec("onnx") is None:
        assert "requires `onnx` to be installed" in errors["taskfit"][1]


def gathering(base):
    class Gather(linear(base)):
        def training_step(self, batch, batch_idx):
            x, _ = batch
            got = self.all_gather({"x": x, "n": 3, "pair": (x.sum(), 1.5)})
            self.gathered = {"x": got["x"].clone(), "n": got["n"], "pair": [t.clone() for t in got["pair"]]}
            self.toggle_optimizer(self.optimizers())
            self.toggled = sorted(p.requires_grad for p in self._param_requires_grad_state)
            self.untoggle_optimizer(self.optimizers())
            self.print("rank-zero", batch_idx)
            return super().training_step(batch, batch_idx)
    return Gather


def test_F_LIT_1_all_gather_toggle_and_print_in_one_process(tmp_path, capsys):
    """In one process all_gather returns the structure with numbers as tensors and no new dimension; with one
    optimizer toggle_optimizer records every parameter; print writes on rank 0 (both frameworks)."""
    seen = {}
    for name, L in _bases().items():
        torch.manual_seed(0)
        m = gathering(L.LightningModule)()
        trainer = L.Trainer(max_steps=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                            enable_checkpointing=False, default_root_dir=str(tmp_path / name))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(m, data())
        g = m.gathered
        seen[name] = (g["x"], g["n"], g["pair"], m.toggled, m._param_requires_grad_state)
    (lx, ln, lp, lt, ls), (tx, tn, tp, tt, ts) = seen["lightning"], seen["taskfit"]
    assert torch.equal(lx, tx) and tx.shape == (4, 4)
    assert torch.equal(ln, tn) and tn.dim() == 0 and int(tn) == 3
    assert all(torch.equal(a, b) for a, b in zip(lp, tp))
    assert lt == tt == [True, True] and ls == ts == {}
    assert capsys.readouterr().out.count("rank-zero 0") == 2


class _Recorder:
    """A Fabric logger that keeps what it was given (user code: Fabric accepts any object with these)."""

    def __init__(self):
        self.rows = []

    def log_metrics(self, metrics, step=None):
        self.rows.append((dict(metrics), step))

    def finalize(self, status):
        pass


def test_F_LIT_1_module_run_by_lightning_fabric():
    """Fabric.setup on the module: fabric is set (on the top module only), self.trainer reads the Fabric,
    optimizers() returns Fabric's optimizer, self.log/log_dict go to Fabric's loggers at once, bad values raise the
    same ValueError."""
    from lightning.fabric import Fabric

    seen = {}
    for name, L in _bases().items():
        m = model(L)
        m.inner = L.LightningModule()
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        rec = _Recorder()
        fabric = Fabric(accelerator="cpu", devices=1, loggers=[rec])
        _, wrapped_opt = fabric.setup(m, opt)
        m.log("a", 1)
        m.log_dict({"b": 0.5, "c": torch.tensor(2.0)})
        m.log("hidden", 1, logger=False)
        with pytest.raises(ValueError) as bad:
            m.log("bad", [1, 2])
        with pytest.raises(ValueError) as nested:
            m.log_dict({"n": {"m": 1}})
        seen[name] = (m.fabric is fabric, m.inner.fabric == fabric, m.trainer.global_rank,
                      m.optimizers() is wrapped_opt, m.loggers == [rec], rec.rows, str(bad.value), str(nested.value))
    assert seen["taskfit"] == seen["lightning"]
    assert seen["taskfit"][:5] == (True, False, 0, True, True)  # Fabric.setup sets the top module only
    assert seen["taskfit"][5] == [({"a": 1}, None), ({"b": 0.5, "c": 2.0}, None)]


@pytest.mark.slow
@pytest.mark.distributed
def test_F_LIT_1_all_gather_under_ddp(tmp_path):
    """Under DDP on 2 CPU processes, all_gather stacks every rank's tensors along a new first dimension (numbers
    too) and ``sync_grads=True`` lets gradients flow back: the same values as Lightning's on every rank."""
    from pathlib import Path

    from jobs_common import run_job

    job = Path(__file__).with_name("gather_job.py")
    got = {fw: run_job(job, tmp_path, fw, {"framework": fw, "devices": 2}) for fw in ("lightning", "taskfit")}
    for lr, tr in zip(got["lightning"], got["taskfit"]):
        assert lr["rank"] == tr["rank"]
        assert tr["x"].shape == (2, 2, 4) and torch.equal(lr["x"], tr["x"])
        assert torch.equal(tr["x"][1], 2 * tr["x"][0])
        assert torch.equal(tr["ranks"], torch.tensor([0, 1])) and torch.equal(lr["ranks"], tr["ranks"])
        assert torch.equal(lr["grad"], tr["grad"])
