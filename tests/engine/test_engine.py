"""The Engine on one process (F-ENGINE-1, F-ENGINE-2): bitwise parity with a plain PyTorch loop, the same
registries and up-front errors as ``Fit``, wrapped optimizer steps through the precision plugin, collectives,
loggers, and checkpoints that move between ``Engine`` and ``Fit`` in both directions."""

from __future__ import annotations

import copy
import csv
import json
import os

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from taskfit import CSVLogger, Engine, Fit, TaskModule
from taskfit.checkpoint.writer import CheckpointError
from taskfit.engine.wrappers import EngineDataLoader, EngineModule, EngineOptimizer


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 12), nn.Tanh(), nn.Linear(12, 2))


def data(n: int = 24) -> TensorDataset:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, 5, generator=g)
    return TensorDataset(x, torch.cos(x[:, :2]))


def test_F_ENGINE_2_single_device_fp32_loop_equals_a_plain_pytorch_loop_bitwise():
    """Accumulation 2 (first micro-batch under no_backward_sync), clipping, a scheduler and several epochs of a
    shuffled loader: every weight and every loss bitwise equal."""
    plain = mlp()
    ours = copy.deepcopy(plain)
    engine = Engine(accelerator="cpu")
    opt = torch.optim.AdamW(ours.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    model, optimizer, scheduler = engine.setup(ours, opt, scheduler=sched)
    assert isinstance(model, EngineModule) and isinstance(optimizer, EngineOptimizer) and scheduler is sched
    assert isinstance(optimizer, EngineOptimizer) and model.module is ours
    torch.manual_seed(7)
    loader = engine.setup_dataloaders(DataLoader(data(), batch_size=4, shuffle=True))
    assert isinstance(loader, EngineDataLoader) and len(loader) == 6
    got_losses = []
    for _ in range(2):
        for i, (x, y) in enumerate(loader):
            last = i % 2 == 1
            with engine.no_backward_sync(model, enabled=not last):
                loss = nn.functional.mse_loss(model(x), y) / 2
                engine.backward(loss)
            got_losses.append(loss.detach())
            if last:
                engine.clip_gradients(model, optimizer, max_norm=0.3)
                optimizer.step()
                optimizer.zero_grad()
                scheduler.step()

    ref_opt = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=2, gamma=0.5)
    torch.manual_seed(7)
    ref_loader = DataLoader(data(), batch_size=4, shuffle=True)
    want_losses = []
    for _ in range(2):
        for i, (x, y) in enumerate(ref_loader):
            loss = nn.functional.mse_loss(plain(x), y) / 2
            loss.backward()
            want_losses.append(loss.detach())
            if i % 2 == 1:
                torch.nn.utils.clip_grad_norm_(plain.parameters(), 0.3)
                ref_opt.step()
                ref_opt.zero_grad()
                ref_sched.step()
    assert torch.equal(torch.stack(got_losses), torch.stack(want_losses))
    for (name, a), b in zip(ours.state_dict().items(), plain.state_dict().values()):
        assert torch.equal(a, b), name
    assert model.state_dict().keys() == plain.state_dict().keys()  # the original module's keys


@pytest.mark.parametrize("kwargs, key", [
    ({"strategy": "dpp"}, "strategy"),
    ({"accelerator": "cpux"}, "accelerator"),
    ({"precision": "bf16-mixd"}, "precision"),
    ({"strategy": "dp", "accelerator": "cpu"}, "dp"),
])
def test_F_ENGINE_1_bad_names_raise_the_same_errors_as_fit_before_any_work(kwargs, key, tmp_path):
    with pytest.raises((ValueError, NotImplementedError)) as fit_error:
        Fit(output_dir=str(tmp_path), report_to="none", **kwargs)
    with pytest.raises(type(fit_error.value)) as engine_error:
        Engine(**kwargs)
    assert str(engine_error.value) == str(fit_error.value)
    assert key in str(engine_error.value)


def test_F_ENGINE_1_shares_the_registry_classes_with_fit(tmp_path):
    fit = Fit(output_dir=str(tmp_path), report_to="none", accelerator="cpu", precision="bf16-mixed")
    engine = Engine(accelerator="cpu", precision="bf16-mixed")
    assert type(engine.strategy) is type(fit.strategy)
    assert type(engine.strategy.precision) is type(fit.strategy.precision)
    assert type(engine.strategy.accelerator) is type(fit.strategy.accelerator)
    assert engine.device == torch.device("cpu") and engine.world_size == 1 and engine.is_global_zero
    assert engine.global_rank == engine.local_rank == engine.node_rank == 0


def test_F_ENGINE_1_bad_input_to_setup_and_calls_is_refused_with_clear_errors():
    engine = Engine(accelerator="cpu")
    with pytest.raises(TypeError, match="needs an nn.Module"):
        engine.setup("model")
    module = mlp()
    with pytest.raises(TypeError, match="optimizer 0 is a list"):
        engine.setup(module, [1])
    model, opt = engine.setup(module, torch.optim.SGD(module.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="already set up"):
        engine.setup(model)
    with pytest.raises(ValueError, match="exactly one of max_norm"):
        engine.clip_gradients(model, opt)
    with pytest.raises(ValueError, match="must be > 0"):
        engine.clip_gradients(model, opt, max_norm=0)
    with pytest.raises(TypeError, match="module engine.setup"):
        engine.no_backward_sync(module)
    with pytest.raises(ValueError, match="reduce_op"):
        engine.all_reduce(torch.ones(2), reduce_op="avg")
    with pytest.raises(TypeError, match="str keys"):
        engine.save("x", [model])
    with pytest.raises(RuntimeError, match="launch"):
        Engine(accelerator="cpu", strategy="ddp", devices=2).setup(mlp())
    with pytest.raises(ValueError, match='Did you mean "fsdp_config"'):
        Engine(accelerator="cpu", fsdp_confg={})


def test_F_ENGINE_1_launch_runs_fn_with_the_engine_and_refuses_a_second_launch():
    engine = Engine(accelerator="cpu")
    assert engine.launch(lambda eng, a, b: (eng is engine, a + b), 2, 3) == (True, 5)
    with pytest.raises(RuntimeError, match="already called"):
        engine.launch()
    with pytest.raises(TypeError, match="callable"):
        Engine(accelerator="cpu").launch(3)
    with pytest.raises(RuntimeError, match="engine.launch\\(fn\\)"):
        Engine(accelerator="cpu", strategy="ddp_spawn", devices=2).launch()


def test_F_ENGINE_1_several_optimizers_and_value_clipping():
    """A GAN-style set-up: two optimizers over two parts of one module, each stepped on its own."""
    module = mlp()
    engine = Engine(accelerator="cpu")
    first, second = list(module[0].parameters()), list(module[2].parameters())
    model, opt_a, opt_b = engine.setup(module, torch.optim.SGD(first, lr=0.1), torch.optim.SGD(second, lr=0.1))
    before = copy.deepcopy(module.state_dict())
    x, y = data().tensors
    engine.backward(nn.functional.mse_loss(model(x), y) * 100)
    assert engine.clip_gradients(model, opt_b, clip_val=1e-3) is None
    assert all(p.grad.abs().max() <= 1e-3 for p in second)
    opt_b.step()
    after = module.state_dict()
    assert torch.equal(after["0.weight"], before["0.weight"]) and not torch.equal(after["2.weight"], before["2.weight"])


def test_F_ENGINE_1_mixed_precision_autocast_and_the_loss_scaler_step():
    """bf16-mixed: forward under autocast, fp32 master weights. 16-mixed: optimizer.step() goes through the
    GradScaler, so inf gradients skip the step and halve the scale."""
    engine = Engine(accelerator="cpu", precision="bf16-mixed")
    model = engine.setup(mlp())
    out = model(torch.randn(3, 5))
    assert out.dtype == torch.bfloat16 and next(model.parameters()).dtype == torch.float32
    with engine.autocast():
        assert (torch.randn(2, 2) @ torch.randn(2, 2)).dtype == torch.bfloat16

    from taskfit.precision.precision import cpu_grad_scaler_supported

    if not cpu_grad_scaler_supported():
        pytest.skip("this torch has no CPU GradScaler")
    engine = Engine(accelerator="cpu", precision="16-mixed")
    module = mlp()
    model, opt = engine.setup(module, torch.optim.SGD(module.parameters(), lr=0.1))
    scaler = engine.strategy.precision.scaler
    before, scale = copy.deepcopy(module.state_dict()), scaler.get_scale()
    engine.backward(model(torch.randn(3, 5)).float().sum() * float("inf"))
    opt.step()
    assert opt.skipped_steps == 1 and scaler.get_scale() == scale / 2
    assert all(torch.equal(v, before[k]) for k, v in module.state_dict().items())
    opt.zero_grad()
    engine.backward(model(torch.randn(3, 5)).float().mean() * 1e-2)
    opt.step()
    assert opt.skipped_steps == 1 and not torch.equal(module.state_dict()["0.weight"], before["0.weight"])


def test_F_ENGINE_1_collectives_print_log_and_rank_zero_first_on_one_process(tmp_path, capsys):
    logger = CSVLogger(str(tmp_path / "logs"), plot=False)
    engine = Engine(accelerator="cpu", loggers=logger)
    assert torch.equal(engine.all_reduce(torch.tensor([1.0, 3.0]), reduce_op="sum"), torch.tensor([1.0, 3.0]))
    assert engine.all_reduce({"a": 2.0})["a"].item() == 2.0
    assert engine.all_gather(torch.tensor([1, 2])).shape == (1, 2)
    assert engine.broadcast({"k": 1}) == {"k": 1}
    engine.barrier()
    order = []
    with engine.rank_zero_first():
        order.append("zero")
    assert order == ["zero"]
    engine.print("hello", 3)
    assert capsys.readouterr().out == "hello 3\n"
    engine.log("loss", torch.tensor(0.5))
    engine.log_dict({"loss": 0.25, "lr": 0.1}, step=10)
    assert engine.to_device({"x": torch.ones(1)})["x"].device == engine.device
    assert engine.seed_everything(5) == 5 and torch.initial_seed() == 5
    engine.teardown()
    with open(tmp_path / "logs" / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [(float(r["loss"]), int(r["step"])) for r in rows] == [(0.5, 0), (0.25, 10)]


def test_F_ENGINE_1_save_and_load_round_trip_values_rng_and_strictness(tmp_path):
    engine = Engine(accelerator="cpu")
    module = mlp()
    model, opt = engine.setup(module, torch.optim.Adam(module.parameters(), lr=0.1))
    sched = torch.optim.lr_scheduler.StepLR(opt.optimizer, step_size=1, gamma=0.5)
    engine.backward(model(torch.randn(4, 5)).sum())
    opt.step()
    sched.step()
    path = str(tmp_path / "ck")
    torch.manual_seed(11)
    engine.save(path, {"model": model, "optimizer": opt, "scheduler": sched, "step": 7, "note": {"a": [1, 2]},
                       "extra": torch.arange(3)})
    manifest = json.loads(open(os.path.join(path, "manifest.json")).read())
    assert manifest["format"] == "taskfit-checkpoint" and manifest["global_step"] == 7
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "training_state.pt", "rng_state_0.pt",
            "fit_args.json"} <= set(manifest["files"])
    expected_draw = torch.rand(3)

    module2 = mlp(seed=5)
    engine2 = Engine(accelerator="cpu")
    model2, opt2 = engine2.setup(module2, torch.optim.Adam(module2.parameters(), lr=0.1))
    sched2 = torch.optim.lr_scheduler.StepLR(opt2.optimizer, step_size=1, gamma=0.5)
    state = {"model": model2, "optimizer": opt2, "scheduler": sched2, "step": 0}
    rest = engine2.load(path, state)
    assert state["step"] == 7 and sched2.last_epoch == 1 and opt2.param_groups[0]["lr"] == 0.05
    assert set(rest) == {"note", "extra"} and rest["note"] == {"a": [1, 2]} and torch.equal(rest["extra"],
                                                                                          torch.arange(3))
    assert torch.equal(torch.rand(3), expected_draw)  # the RNG continues where the save left it
    for k, v in module.state_dict().items():
        assert torch.equal(module2.state_dict()[k], v)
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    with pytest.raises(KeyError, match="missing_key"):
        engine2.load(path, {"model": model2, "missing_key": 1})
    assert engine2.load(path, {"model": model2, "missing_key": 1}, strict=False)["step"] == 7
    os.remove(os.path.join(path, "manifest.json"))
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        engine2.load(path, state)


# kept local: the same MLP (mlp(seed)) and AdamW as the Engine loop it is compared with
class Regressor(TaskModule):
    """The same module in a Fit run and in an Engine loop: ``forward`` for the Engine, ``training_step`` for Fit."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.net = mlp(seed)

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2, weight_decay=0.01)


def _fit(tmp_path, name: str, steps: int, **kw) -> Fit:
    return Fit(output_dir=str(tmp_path / name), report_to="none", disable_tqdm=True, accelerator="cpu",
               max_steps=steps, per_device_train_batch_size=24, max_grad_norm=0.0, lr_scheduler_type="constant",
               **kw)


def _engine_steps(engine: Engine, model, opt, n: int) -> None:
    x, y = data().tensors
    for _ in range(n):
        engine.backward(nn.functional.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()


def _assert_close(a: nn.Module, b: nn.Module, tol: float = 1e-6) -> None:
    for k, v in a.state_dict().items():
        assert (b.state_dict()[k] - v).abs().max() <= tol, k


def test_F_ENGINE_1_a_fit_checkpoint_loads_into_an_engine_loop_and_continues_like_fit(tmp_path):
    """Fit trains 3 steps and saves at step 2; an Engine loads checkpoint-2 (weights and AdamW state) into a
    differently initialised module, takes the third step and ends where Fit ended."""
    fitted = Regressor()
    _fit(tmp_path, "fit", 3, save_strategy="steps", save_steps=2).fit(fitted, train_data=data())
    engine = Engine(accelerator="cpu")
    module = Regressor(seed=9)
    model, opt = engine.setup(module, module.configure_optimizers())
    rest = engine.load(tmp_path / "fit" / "checkpoint-2", {"model": model, "optimizer": opt})
    assert rest["global_step"] == 2
    _engine_steps(engine, model, opt, 1)
    _assert_close(module, fitted)
    module_no_opt = Regressor(seed=9)  # the optimizer state matters: fresh AdamW moments end elsewhere
    model2, opt2 = Engine(accelerator="cpu").setup(module_no_opt, module_no_opt.configure_optimizers())
    Engine(accelerator="cpu").load(tmp_path / "fit" / "checkpoint-2", {"model": model2})
    _engine_steps(engine, model2, opt2, 1)
    assert (module_no_opt.net[0].weight - fitted.net[0].weight).abs().max() > 1e-4


def test_F_ENGINE_1_an_engine_checkpoint_resumes_a_fit_run(tmp_path):
    """An Engine loop takes 2 steps and saves; Fit resumes from that folder (weights, AdamW state, global_step)
    and its third step ends where the Engine's own third step does."""
    engine = Engine(accelerator="cpu")
    module = Regressor()
    model, opt = engine.setup(module, module.configure_optimizers())
    _engine_steps(engine, model, opt, 2)
    engine.save(tmp_path / "eng", {"model": model, "optimizer": opt, "step": 2})
    _engine_steps(engine, model, opt, 1)
    resumed = Regressor(seed=9)
    fit = _fit(tmp_path, "fit", 3)
    fit.fit(resumed, train_data=data(), resume_from_checkpoint=str(tmp_path / "eng"))
    assert fit.state.global_step == 3
    _assert_close(module, resumed)
