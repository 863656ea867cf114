"""Per-run state (F-CORE-3): every fit/validate/test/predict call works on its own run, so calling ``fit`` twice,
``model_init`` and ``auto_find_batch_size`` retries (F-LOOP-7) behave as fresh runs; the training state is saved and
restored whole (F-LOOP-6, F-CKPT-2); several optimizers (F-LOOP-4) and the strategy contract."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from taskfit import Callback, Fit, FitArguments, TaskModule
from taskfit.loops.state import FitControl, FitState, LossSums, TrainingState, plan_fields
from taskfit.precision.precision import Precision


def _args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path), disable_tqdm=True, report_to="none", save_strategy="no",
                logging_steps=3, seed=5, per_device_train_batch_size=8, max_steps=12, learning_rate=0.05)
    base.update(kw)
    return FitArguments(**base)


class Net(TaskModule):
    # kept local: the runs compare dropout RNG, an epoch-logged metric and two optimizers over a hidden layer
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Dropout(0.2), torch.nn.Tanh(),
                                       torch.nn.Linear(12, 3))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_ce", loss, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_ce", F.cross_entropy(self.net(x), y))

    def predict_step(self, batch, batch_idx):
        return self.net(batch[0]).argmax(-1)


def _data(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    return TensorDataset(x, x[:, :3].argmax(-1))


def _net(seed=0):
    torch.manual_seed(seed)
    return Net()


def _rows(fit):
    return [{k: v for k, v in r.items() if "runtime" not in k and "per_second" not in k} for r in fit.state.log_history]


def _equal(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_F_CORE_3_fit_twice_on_one_fit_equals_two_fresh_fits(tmp_path):
    """The second fit() on the same Fit (new model) is the run a fresh Fit makes: weights, logs, train_loss and a
    fresh optimizer (the first run's optimizer and loop state do not leak)."""
    fit = Fit(_args(tmp_path))
    first, second = _net(), _net()
    out1 = fit.fit(first, _data(), _data(16, seed=1))
    opt1, rows1 = fit.optimizer, _rows(fit)
    out2 = fit.fit(second, _data(), _data(16, seed=1))
    assert fit.optimizer is not opt1 and fit.model is second and fit.state.global_step == 12
    fresh = _net()
    ref = Fit(_args(tmp_path))
    ref_out = ref.fit(fresh, _data(), _data(16, seed=1))
    assert _equal(second, fresh) and _equal(first, fresh)
    assert out2.training_loss == ref_out.training_loss == out1.training_loss
    assert _rows(fit) == _rows(ref) == rows1
    assert fit.validate()["val_ce"] == ref.validate()["val_ce"]  # the last run's model and eval data


def test_F_CORE_3_model_init_builds_a_fresh_model_for_every_fit(tmp_path):
    """HF semantics: fit() without a model calls model_init every time; validate() uses the last run's model."""
    built = []

    def model_init():
        built.append(Net())
        return built[-1]

    fit = Fit(_args(tmp_path), model_init=model_init)
    out1 = fit.fit(None, _data())
    out2 = fit.fit(None, _data())
    assert len(built) == 2 and built[0] is not built[1] and fit.model is built[1]
    assert _equal(built[0], built[1]) and out1.training_loss == out2.training_loss  # both seeded by args.seed
    fit.validate(data=_data(16, seed=1))
    assert len(built) == 2  # evaluation does not build a model


class OOMOnceAfterAStep(Net):
    """Raises an allocator out-of-memory error at the second step of any run whose batches exceed ``limit``."""

    def __init__(self, limit=4):
        super().__init__()
        self.limit, self.calls = limit, 0

    def training_step(self, batch, batch_idx):
        self.calls += 1
        if batch[0].shape[0] > self.limit and self.calls == 2:
            raise RuntimeError("CUDA out of memory. Tried to allocate 1 TiB (injected)")
        return super().training_step(batch, batch_idx)


def test_F_LOOP_7_auto_find_batch_size_retry_is_a_fresh_run(tmp_path):
    """An OOM after one optimizer step: the retry (model_init: a fresh model, fresh optimizer and loop state)
    ends equal to a run started at the smaller batch size."""
    models = []

    def model_init():
        torch.manual_seed(0)
        models.append(OOMOnceAfterAStep())
        return models[-1]

    fit = Fit(_args(tmp_path, auto_find_batch_size=True), model_init=model_init)
    out = fit.fit(None, _data())
    assert len(models) == 2 and fit.args.per_device_train_batch_size == 4 and fit.state.global_step == 12
    ref = Fit(_args(tmp_path, per_device_train_batch_size=4), model_init=model_init)  # same seeding order
    ref_out = ref.fit(None, _data())
    assert _equal(models[1], models[2]) and out.training_loss == ref_out.training_loss
    assert _rows(fit) == _rows(ref)


class TwoOptimizers(Net):
    """Two optimizers over disjoint parameters, stepped together by the module: several optimizers need manual
    optimization (Lightning 2.x refuses them under automatic optimization, and so does Fit)."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        opts = self.optimizers()
        for opt in opts:
            opt.zero_grad()
        self.manual_backward(loss)
        for opt in opts:
            opt.step()
        return loss

    def configure_optimizers(self):
        first, last = self.net[0], self.net[3]
        return [torch.optim.SGD(first.parameters(), lr=0.05), torch.optim.SGD(last.parameters(), lr=0.05)]


class OneOptimizer(Net):
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def test_F_LOOP_4_several_optimizers_step_together_and_resume(tmp_path):
    """Two optimizers over disjoint parameters stepped every batch (manual optimization) train as one optimizer
    over all would; both are checkpointed (optimizer.pt, optimizer_1.pt) and a resumed run ends equal."""
    torch.manual_seed(0)
    two = TwoOptimizers()
    torch.manual_seed(0)
    single = OneOptimizer()
    fit = Fit(_args(tmp_path / "two", save_strategy="steps", save_steps=5))
    fit.fit(two, _data())
    Fit(_args(tmp_path / "one", max_grad_norm=0.0)).fit(single, _data())  # manual optimization does not clip
    assert _equal(two, single) and len(fit.optimizers) == 2
    files = sorted(p.name for p in (tmp_path / "two" / "checkpoint-5").iterdir())
    assert "optimizer.pt" in files and "optimizer_1.pt" in files
    torch.manual_seed(0)
    resumed = TwoOptimizers()
    Fit(_args(tmp_path / "two", save_strategy="steps", save_steps=5)).fit(
        resumed, _data(), resume_from_checkpoint=str(tmp_path / "two" / "checkpoint-5"))
    assert _equal(two, resumed)


def test_F_LOOP_4_several_optimizers_under_automatic_optimization_are_refused(tmp_path):
    """Lightning 2.x's rule: several optimizers need automatic_optimization = False; refused before any step."""
    class Auto(Net):
        configure_optimizers = TwoOptimizers.configure_optimizers

    fit = Fit(_args(tmp_path))
    with pytest.raises(RuntimeError, match="only supported with manual optimization.*automatic_optimization = False"):
        fit.fit(Auto(), _data())
    assert fit.state.global_step == 0


class Stateful(Callback):
    def __init__(self):
        self.count = 0

    def on_train_batch_end(self, fit, module, outputs, batch, batch_idx):
        self.count += 1

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state):
        self.count = state["count"]


def test_F_LOOP_6_training_state_round_trip_restores_every_field(tmp_path):
    """A run's TrainingState saved mid-run and loaded into fresh objects reproduces every field: loop state,
    control flags, running loss sums, grad scaler state, callback states, self.log aggregates and RNG states."""
    cb = Stateful()
    fit = Fit(_args(tmp_path, max_steps=5, logging_steps=2, max_grad_norm=1.0), callbacks=[cb])
    module = _net()
    fit.fit(module, _data())
    run = fit._last_fit
    run.control.should_evaluate = True
    saved = run.training_state.state_dict()
    assert saved["version"] == TrainingState.VERSION and saved["loop"]["steps_since_log"] == 1

    class ScalerLike(Precision):
        def __init__(self):
            super().__init__()
            self.loaded = None

        def load_state_dict(self, state):
            self.loaded = state

    state, control, sums, precision, cb2 = FitState(), FitControl(), LossSums(), ScalerLike(), Stateful()
    fresh = _net(1)
    fresh._results = copy.deepcopy(module._results)
    fresh._results.reset_epoch()
    restored = TrainingState(state, control, sums, precision, [cb2], fresh)
    restored.load_state_dict(copy.deepcopy(saved))
    assert not set(plan_fields()) & set(saved["state"])  # the plan is saved apart and never loaded
    for k, v in saved["state"].items():
        assert getattr(state, k) == v, k
    assert control.state_dict() == {**saved["control"], "should_evaluate": False}  # per-step flags reset
    assert torch.equal(sums.tr_loss, saved["loop"]["tr_loss_per_rank"][0]) and sums.tr_loss.item() > 0
    assert (sums.steps_since_log, sums.total_loss) == (1, saved["loop"]["total_loss"])
    assert torch.equal(sums.grad_norm, saved["loop"]["grad_norm"]) and sums.loss_start_step == 0
    assert precision.loaded == saved["precision"] and cb2.count == cb.count == 5
    assert fresh._results.state_dict() == module._results.state_dict()
    assert torch.equal(restored.rng["torch"], saved["rng"]["torch"]) and restored.rng["python"] == saved["rng"]["python"]
    again = TrainingState(state, control, sums, precision, [cb2], fresh).state_dict()
    assert again["loop"]["total_loss"] == saved["loop"]["total_loss"]
    assert torch.equal(again["loop"]["tr_loss_per_rank"], saved["loop"]["tr_loss_per_rank"])
    assert again["state"]["log_history"] == saved["state"]["log_history"]


def test_F_CKPT_2_version_1_training_state_still_loads(tmp_path):
    """A version-1 training state (rank 0's loss sum only, no version field) restores with that sum."""
    state, control, sums = FitState(), FitControl(), LossSums()
    old = {"state": FitState(global_step=4, epoch=1.5).state_dict(), "control": {},
           "loop": {"tr_loss": torch.tensor(2.5), "steps_since_log": 2, "total_loss": 7.0, "epoch_done": False,
                    "grad_norm": None}, "precision": {}, "callbacks": {}, "results": {}}
    TrainingState(state, control, sums).load_state_dict(old)
    assert state.global_step == 4 and sums.tr_loss.item() == 2.5 and sums.total_loss == 7.0


def test_F_CORE_3_strategy_declares_capabilities_and_refuses_too_many_optimizers(tmp_path):
    """Callers read capabilities (no isinstance); a strategy with an optimizer limit refuses more before any
    work, naming the limit."""
    fit = Fit(_args(tmp_path))
    s = fit.strategy
    assert (s.shards_parameters, s.engine_owns_step, s.max_optimizers, s.builds_own_optimizer) == (
        False, False, None, False)
    module = TwoOptimizers()
    optimizers = module.configure_optimizers()
    s.max_optimizers = 1
    with pytest.raises(ValueError, match="at most 1 optimizer"):
        s.setup(module, optimizers, [])
    del s.max_optimizers
    wrapped, opts, scheds = s.setup(module, optimizers, [])
    assert wrapped is module and opts == optimizers and scheds == []


def test_F_CORE_3_teardown_runs_after_every_stage_also_on_error(tmp_path, monkeypatch):
    fit = Fit(_args(tmp_path, max_steps=2))
    calls = []
    original = type(fit.strategy).teardown
    monkeypatch.setattr(type(fit.strategy), "teardown", lambda self: (calls.append(1), original(self)))
    module = _net()
    fit.fit(module, _data())
    fit.validate(module, _data(16))
    fit.test(module, _data(16))
    fit.predict(module, _data(16))
    assert len(calls) == 4

    class Boom(Net):
        def training_step(self, batch, batch_idx):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fit.fit(Boom(), _data())
    assert len(calls) == 5
