"""Logging: ``self.log`` semantics (F-CORE-1), progress bar and CSV logger (F-OBS-1, F-OBS-2), ``log_history``
and train metrics (F-EVAL-4), ``log_metrics``/``save_metrics`` (F-EVAL-5), torchmetrics objects (F-EVAL-2), and
the hot-path rule of DESIGN.md (no host sync on steps where nothing is logged)."""

from __future__ import annotations

import csv
import json
import math
import re
import traceback

import pytest
import torch
from helpers import models
from taskfit import Callback, Fit, ProgressBar, TaskModule
from torch import nn
from torch.utils.data import TensorDataset


def _fit(tmp_path, **kwargs) -> Fit:
    opts = {"output_dir": str(tmp_path), "disable_tqdm": True, "report_to": "none", "save_strategy": "no",
            "per_device_train_batch_size": 2, "per_device_eval_batch_size": 2}
    extra = {k: kwargs.pop(k) for k in list(kwargs) if k in ("callbacks", "compute_metrics")}
    opts.update(kwargs)
    return Fit(**opts, **extra)


def _data(n: int, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    return TensorDataset(x, x.sum(-1))


class Regression(models.Regression):
    """The canonical regression (3 features, seed 0; ``forward`` squeezed to ``(B,)``) recording each step's loss."""

    def __init__(self) -> None:
        super().__init__(features=3, seed=0)
        self.step_losses: list[float] = []

    def forward(self, x):
        return super().forward(x).squeeze(-1)

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.step_losses.append(float(loss.detach()))
        return loss


def _history(fit: Fit, key: str) -> list[dict]:
    return [h for h in fit.state.log_history if key in h]


# ----------------------------------------------------------------------------------- self.log semantics ---
class TrainLogs(Regression):
    def training_step(self, batch, batch_idx):
        self.log("only_step", float(batch_idx))  # training default: on_step=True, on_epoch=False
        self.log("both", float(batch_idx), on_step=True, on_epoch=True)
        self.log("only_epoch", float(batch_idx), on_step=False, on_epoch=True)
        self.log("total", 1.0, on_step=False, on_epoch=True, reduce_fx="sum")
        self.log("biggest", torch.tensor(float(batch_idx)), on_step=False, on_epoch=True, reduce_fx="max")
        return super().training_step(batch, batch_idx)


def test_log_on_step_on_epoch_names_and_values_F_CORE_1(tmp_path):
    """F-CORE-1: in training_step ``self.log`` defaults to on_step (last value at each logging step, key
    ``name``); on_step+on_epoch gives ``name_step`` and ``name_epoch``; on_epoch means are weighted by batch size
    (7 samples, batches 2, 2, 2, 1: mean of batch_idx = (0*2 + 1*2 + 2*2 + 3*1) / 7); sum and max reduce."""
    fit = _fit(tmp_path, num_train_epochs=2, logging_steps=2)
    fit.fit(TrainLogs(), _data(7))
    steps = _history(fit, "loss")
    assert [h["step"] for h in steps] == [2, 4, 6, 8]
    assert [h["only_step"] for h in steps] == [1.0, 3.0, 1.0, 3.0]
    assert [h["both_step"] for h in steps] == [1.0, 3.0, 1.0, 3.0]
    assert all("both" not in h and "only_epoch" not in h and "both_epoch" not in h for h in steps)
    epochs = _history(fit, "both_epoch")
    assert [h["step"] for h in epochs] == [4, 8]
    for h in epochs:
        assert h["both_epoch"] == pytest.approx(9 / 7)
        assert h["only_epoch"] == pytest.approx(9 / 7)
        assert h["total"] == 4.0
        assert h["biggest"] == 3.0
        assert "only_step" not in h and "both_step" not in h


class ValLogs(Regression):
    def validation_step(self, batch, batch_idx):
        x, _y = batch
        self.log("val_x", x[:, 0].mean())  # validation default: on_epoch=True, batch-size-weighted mean
        self.log("val_count", float(len(x)), reduce_fx="sum")
        self.log("val_max", x[:, 0].max(), reduce_fx="max")
        self.log("val_min", x[:, 0].min(), reduce_fx="min")
        self.log("val_explicit", float(batch_idx), batch_size=batch_idx + 1)
        return x[:, 0].mean()  # the loss: eval_loss is also a batch-size-weighted mean


def test_validation_epoch_mean_is_weighted_by_batch_size_F_CORE_1(tmp_path):
    """F-CORE-1 / F-EVAL-1: eval set x = 0..4, batches [0, 1], [2, 3], [4]: the batch means 0.5, 2.5, 4.0 average
    to (0.5*2 + 2.5*2 + 4*1) / 5 = 2.0 (an unweighted mean would be 2.333); explicit ``batch_size`` weights
    (0*1 + 1*2 + 2*3) / 6; sum = 5, max = 4, min = 0."""
    x = torch.arange(5.0).unsqueeze(-1).repeat(1, 3)
    fit = _fit(tmp_path, max_steps=1)
    module = ValLogs()
    fit.fit(module, _data(4))
    m = fit.validate(module, TensorDataset(x, torch.zeros(5)))
    assert m["val_x"] == pytest.approx(2.0)
    assert m["eval_loss"] == pytest.approx(2.0)
    assert m["val_explicit"] == pytest.approx(8 / 6)
    assert m["val_count"] == 5.0 and m["val_max"] == 4.0 and m["val_min"] == 0.0
    assert all(isinstance(v, float) for v in m.values())


def test_log_rejects_bad_values_F_CORE_1(tmp_path):
    """F-CORE-1: a non-scalar tensor or an unknown reduce_fx in self.log -> ValueError naming the metric."""

    class BadShape(Regression):
        def training_step(self, batch, batch_idx):
            self.log("vec", torch.ones(3))
            return super().training_step(batch, batch_idx)

    class BadReduce(Regression):
        def training_step(self, batch, batch_idx):
            self.log("m", 1.0, reduce_fx="median")
            return super().training_step(batch, batch_idx)

    with pytest.raises(ValueError, match=r"'vec'.*shape \(3,\)"):
        _fit(tmp_path, max_steps=1).fit(BadShape(), _data(4))
    with pytest.raises(ValueError, match="reduce_fx='median'.*'m'.*mean"):
        _fit(tmp_path, max_steps=1).fit(BadReduce(), _data(4))
    with pytest.raises(RuntimeError, match="outside a Fit stage"):
        Regression().log("x", 1.0)


def test_torchmetrics_object_computed_and_reset_per_evaluation_F_EVAL_2(tmp_path):
    """F-EVAL-2: a torchmetrics Metric logged as an object in validation_step is computed at the end of the
    evaluation and reset before the next one: two evaluations on different data give independent values."""
    torchmetrics = pytest.importorskip("torchmetrics")

    class WithMetric(Regression):
        def __init__(self) -> None:
            super().__init__()
            self.mean_target = torchmetrics.MeanMetric()

        def validation_step(self, batch, batch_idx):
            _x, y = batch
            self.mean_target.update(y)
            self.log("val_mean_target", self.mean_target)

    module = WithMetric()
    fit = _fit(tmp_path, max_steps=1)
    fit.fit(module, _data(4))
    ones = TensorDataset(torch.zeros(5, 3), torch.ones(5))
    zeros = TensorDataset(torch.zeros(3, 3), torch.zeros(3))
    assert fit.validate(module, ones)["val_mean_target"] == pytest.approx(1.0)
    assert fit.validate(module, zeros)["val_mean_target"] == pytest.approx(0.0)
    assert fit.validate(module, ones)["val_mean_target"] == pytest.approx(1.0)


def test_torchmetrics_object_in_training_is_per_epoch_F_EVAL_2(tmp_path):
    """F-EVAL-2: a Metric logged in training_step with on_epoch=True is computed per epoch and reset between."""
    torchmetrics = pytest.importorskip("torchmetrics")

    class WithMetric(Regression):
        def __init__(self) -> None:
            super().__init__()
            self.seen = torchmetrics.SumMetric()

        def training_step(self, batch, batch_idx):
            self.seen.update(torch.tensor(float(len(batch[0]))))
            self.log("samples", self.seen, on_step=False, on_epoch=True)
            return super().training_step(batch, batch_idx)

    fit = _fit(tmp_path, num_train_epochs=3)
    fit.fit(WithMetric(), _data(6))
    assert [h["samples"] for h in _history(fit, "samples")] == [6.0, 6.0, 6.0]


def test_prog_bar_values_reach_the_progress_bar_F_OBS_1(tmp_path):
    """F-OBS-1: with the progress bar on, its postfix shows loss, learning rate and values logged with
    ``prog_bar=True`` (not the others); with ``disable_tqdm`` no bar is installed."""
    postfixes = []

    class Shown(Regression):
        def training_step(self, batch, batch_idx):
            self.log("shown", 0.25, prog_bar=True)
            self.log("hidden", 0.5)
            return super().training_step(batch, batch_idx)

    class Peek(Callback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            bar = next(cb for cb in fit.callbacks if isinstance(cb, ProgressBar)).train_bar
            if bar is not None and "loss" in logs:
                postfixes.append(bar.postfix)

    fit = _fit(tmp_path, max_steps=4, logging_steps=2, disable_tqdm=False, callbacks=[Peek()])
    assert isinstance(fit.callbacks[0], ProgressBar)
    fit.fit(Shown(), _data(8))
    assert len(postfixes) == 2
    for text in postfixes:
        assert "loss=" in text and "learning_rate=" in text and "shown=0.25" in text
        assert "hidden" not in text and "grad_norm" not in text
    assert not any(isinstance(cb, ProgressBar) for cb in _fit(tmp_path).callbacks)


# -------------------------------------------------------------------------------- history and loggers ---
def test_log_history_losses_learning_rates_and_train_loss_F_EVAL_4(tmp_path):
    """F-EVAL-4: every logged dict lands in ``state.log_history`` with its step; a logged ``loss`` is the mean of
    the step losses since the previous log (HF rule); ``learning_rate`` is the rate the logged step used, before
    its scheduler step, as HF 5 (linear decay from 0.1 over 6 steps); ``train_loss`` is the mean over all steps."""
    module = Regression()
    fit = _fit(tmp_path, max_steps=6, logging_steps=2, learning_rate=0.1, max_grad_norm=0)
    out = fit.fit(module, _data(12))
    logs = _history(fit, "loss")
    assert [h["step"] for h in logs] == [2, 4, 6]
    # grad_norm even with clipping off (HF 5 computes the norm with an infinite maximum)
    assert set(logs[0]) == {"loss", "grad_norm", "learning_rate", "epoch", "step"}
    losses = module.step_losses
    for i, h in enumerate(logs):
        assert h["loss"] == pytest.approx((losses[2 * i] + losses[2 * i + 1]) / 2, abs=1e-6)
        assert h["learning_rate"] == pytest.approx(0.1 * (1 - (2 * i + 1) / 6))
        assert h["epoch"] == pytest.approx((2 * i + 2) / 6, abs=1e-4)
    assert out.training_loss == pytest.approx(sum(losses) / 6, rel=1e-6)
    assert out["train_loss"] == out.training_loss
    assert fit.state.log_history[-1]["train_loss"] == out["train_loss"]
    assert fit.state.log_history[-1]["step"] == 6


def test_logging_strategy_epoch_and_no_F_LOOP_1(tmp_path):
    """F-LOOP-1: ``logging_strategy="epoch"`` logs the mean step loss once per epoch (6 samples, batch 2: steps 3
    and 6); ``"no"`` logs no loss at all, while ``train_loss`` is still the mean over all steps."""
    module = Regression()
    fit = _fit(tmp_path, num_train_epochs=2, logging_strategy="epoch", logging_steps=1)
    out = fit.fit(module, _data(6))
    logs = _history(fit, "loss")
    assert [h["step"] for h in logs] == [3, 6]
    assert logs[0]["loss"] == pytest.approx(sum(module.step_losses[:3]) / 3, abs=1e-6)
    assert out["train_loss"] == pytest.approx(sum(module.step_losses) / 6, rel=1e-6)
    module = Regression()
    fit = _fit(tmp_path, num_train_epochs=2, logging_strategy="no", logging_steps=1)
    out = fit.fit(module, _data(6))
    assert _history(fit, "loss") == []
    assert out["train_loss"] == pytest.approx(sum(module.step_losses) / 6, rel=1e-6)


def test_grad_norm_is_logged_when_clipping_F_EVAL_4(tmp_path):
    """F-EVAL-4 / F-LOOP-3: with clipping on, ``grad_norm`` (the norm before clipping) is logged."""
    fit = _fit(tmp_path, max_steps=2, logging_steps=1, max_grad_norm=1e-3)
    fit.fit(Regression(), _data(8))
    norms = [h["grad_norm"] for h in _history(fit, "loss")]
    assert len(norms) == 2 and all(n > 1e-3 for n in norms)


def test_grad_norm_without_clipping_is_computed_for_log_rows_and_saves_only_F_EVAL_4(tmp_path, monkeypatch):
    """F-EVAL-4 / DESIGN.md hot path: with clipping off, HF 5 logs the gradient norm of the logged step; taskfit
    computes it only for a log row or a checkpoint (steps 3, 4, 6, 8, 9 of 9 with logging_steps=3,
    save_steps=4), from that step's gradients: equal to the norm the module sees before its optimizer step."""

    class Probe(Regression):
        def __init__(self) -> None:
            super().__init__()
            self.norms: list[float] = []

        def on_before_optimizer_step(self, optimizer):
            grads = [p.grad.detach().flatten() for p in self.parameters() if p.grad is not None]
            self.norms.append(float(torch.cat(grads).norm()))

    fit = _fit(tmp_path, max_steps=9, logging_steps=3, max_grad_norm=0, save_strategy="steps", save_steps=4,
               learning_rate=0.05)
    strategy_cls = type(fit.strategy)
    plain, calls = strategy_cls.clip_gradients, []

    def counted(self, *a, **kw):
        calls.append(fit.state.global_step)
        return plain(self, *a, **kw)

    monkeypatch.setattr(strategy_cls, "clip_gradients", counted)
    module = Probe()
    fit.fit(module, _data(40))
    assert calls == [3, 4, 6, 8, 9]
    logs = _history(fit, "loss")
    assert [h["step"] for h in logs] == [3, 6, 9]
    assert [h["grad_norm"] for h in logs] == pytest.approx([module.norms[2], module.norms[5], module.norms[8]],
                                                          rel=1e-6)


def test_log_history_epoch_with_gradient_accumulation_F_EVAL_4(tmp_path):
    """F-EVAL-4 / F-LOOP-2: ``epoch`` in the logs is the fraction of the epoch done (HF semantics). With 8
    micro-batches per epoch and accumulation 2 there are 4 optimizer steps per epoch: 0.25, 0.5, ..., 2.0."""
    fit = _fit(tmp_path, num_train_epochs=2, gradient_accumulation_steps=2, logging_steps=1)
    out = fit.fit(Regression(), _data(16))
    assert out.global_step == 8
    assert [h["epoch"] for h in _history(fit, "loss")] == [0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0]
    assert out["epoch"] == 2.0


def test_train_metrics_keys_and_values_F_EVAL_4(tmp_path):
    """F-EVAL-4: ``fit()`` returns ``train_runtime`` (s), ``train_samples_per_second``,
    ``train_steps_per_second``, ``total_flos`` (6 x parameters x samples), ``train_loss`` and ``epoch``."""
    fit = _fit(tmp_path, num_train_epochs=2)
    out = fit.fit(Regression(), _data(10))
    assert set(out.metrics) == {"train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos",
                        "train_loss", "epoch"}
    assert out.global_step == 10 and out["epoch"] == 2.0
    assert out["total_flos"] == 6 * 4 * 20  # Linear(3, 1): 4 parameters, 20 samples
    assert out["train_runtime"] > 0
    rel = 6e-5 / out["train_runtime"] + 1e-3  # the runtime is reported rounded to 4 decimals
    assert out["train_samples_per_second"] == pytest.approx(20 / out["train_runtime"], rel=rel)
    assert out["train_steps_per_second"] == pytest.approx(10 / out["train_runtime"], rel=rel)
    assert math.isfinite(out["train_loss"]) and out.metrics == dict(out)


def test_csv_logger_rows_at_logging_steps_F_OBS_2(tmp_path):
    """F-OBS-2: ``report_to="csv"`` writes ``<output_dir>/logs/metrics.csv`` with one row per log at the right
    step (``logging_first_step`` plus every 5 steps of 12), the end-of-run summary in ``summary.json`` (not in
    the CSV, whose columns stay the per-step names) and ``hparams.yaml``."""
    fit = _fit(tmp_path, report_to="csv", max_steps=12, logging_steps=5, logging_first_step=True)
    fit.fit(Regression(), _data(24))
    path = tmp_path / "logs" / "metrics.csv"
    rows = list(csv.DictReader(path.open()))
    loss_rows = [r for r in rows if r["loss"]]
    assert [int(r["step"]) for r in loss_rows] == [1, 5, 10]
    assert [float(r["loss"]) for r in loss_rows] == [h["loss"] for h in _history(fit, "loss")]
    assert len(rows) == 3 and "train_runtime" not in rows[0]
    summary = json.loads((tmp_path / "logs" / "summary.json").read_text())
    assert summary["step"] == 12 and summary["train_runtime"] > 0
    assert summary["train_loss"] == pytest.approx(fit.state.log_history[-1]["train_loss"])
    hparams = (tmp_path / "logs" / "hparams.yaml").read_text()
    assert "logging_steps: 5" in hparams and "max_steps: 12" in hparams


def test_csv_logger_includes_eval_rows_and_logging_dir_F_OBS_2(tmp_path):
    """F-OBS-2: evaluation metrics get their own rows (new columns rewrite the header); ``logging_dir`` moves
    the file."""

    class V(Regression):
        def validation_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self(x), y)

    logdir = tmp_path / "elsewhere"
    fit = _fit(tmp_path, report_to="csv", logging_dir=str(logdir), max_steps=4, logging_steps=2,
               eval_strategy="steps", eval_steps=2)
    fit.fit(V(), _data(8), _data(4, seed=1))
    rows = list(csv.DictReader((logdir / "metrics.csv").open()))
    assert [int(r["step"]) for r in rows if r["eval_loss"]] == [2, 4]
    assert [int(r["step"]) for r in rows if r["loss"]] == [2, 4]
    assert not (tmp_path / "logs").exists()


def test_report_to_none_writes_no_logs_F_OBS_2(tmp_path):
    """F-OBS-2: ``report_to="none"`` (normalised by FitArguments to ``[]``) installs no logger and writes no
    metrics file; ``report_to="csv"`` installs exactly one CSV logger."""
    fit = _fit(tmp_path, max_steps=2, logging_steps=1)
    fit.fit(Regression(), _data(4))
    assert fit.loggers == [] and not (tmp_path / "logs").exists()
    assert [type(lg).__name__ for lg in _fit(tmp_path, report_to="csv").loggers] == ["CSVLogger"]


# ----------------------------------------------------------------------------- log_metrics / save_metrics ---
def test_log_metrics_prints_a_table_F_EVAL_5(tmp_path, capsys):
    """F-EVAL-5: ``log_metrics(split, metrics)`` prints a header and one aligned ``key = value`` line per metric
    (sorted; runtimes as h:mm:ss.ss, FLOPs in GF, floats rounded to 4 decimals), as HF's ``log_metrics``."""
    fit = _fit(tmp_path)
    fit.log_metrics("train", {"train_runtime": 3725.5, "total_flos": 3.2e12, "train_loss": 0.123456789,
                              "epoch": 3.0, "train_samples": 17})
    lines = capsys.readouterr().out.rstrip("\n").split("\n")
    assert lines[0] == "***** train metrics *****"
    body = {re.split(r"\s*=\s*", l.strip())[0]: re.split(r"\s*=\s*", l.strip())[1] for l in lines[1:]}
    assert list(body) == sorted(body)
    assert body == {"epoch": "3.0", "total_flos": "3200GF", "train_loss": "0.1235", "train_runtime": "1:02:05.50",
                    "train_samples": "17"}
    assert len({l.index("=") for l in lines[1:]}) == 1  # aligned


def test_save_metrics_writes_split_and_all_results_F_EVAL_5(tmp_path):
    """F-EVAL-5: ``save_metrics`` writes ``{split}_results.json`` and merges into ``all_results.json``
    (``combined=False`` leaves it alone)."""
    fit = _fit(tmp_path)
    fit.save_metrics("train", {"train_loss": 0.5, "epoch": 1.0})
    fit.save_metrics("eval", {"eval_loss": 0.25, "epoch": 1.0})
    fit.save_metrics("test", {"test_loss": 0.75}, combined=False)
    assert json.loads((tmp_path / "train_results.json").read_text()) == {"train_loss": 0.5, "epoch": 1.0}
    assert json.loads((tmp_path / "eval_results.json").read_text()) == {"eval_loss": 0.25, "epoch": 1.0}
    assert json.loads((tmp_path / "test_results.json").read_text()) == {"test_loss": 0.75}
    assert json.loads((tmp_path / "all_results.json").read_text()) == {"train_loss": 0.5, "eval_loss": 0.25,
                                                                        "epoch": 1.0}


def test_save_metrics_of_a_real_run_F_EVAL_5(tmp_path):
    """F-EVAL-5: the dict ``fit()`` returns can be saved as is (JSON-serialisable floats)."""
    fit = _fit(tmp_path, max_steps=2)
    out = fit.fit(Regression(), _data(4))
    fit.save_metrics("train", out.metrics)
    assert json.loads((tmp_path / "train_results.json").read_text()) == out.metrics


# ----------------------------------------------------------------------------------------- hot path ---
_SYNCS = ("item", "__float__", "__bool__", "__int__", "tolist")


def _count_syncs(monkeypatch, fit: Fit, calls: list) -> None:
    """Patch the tensor-to-host conversions to record ``(name, global_step, caller file:line)``."""

    def counting(name, original):
        def wrapper(self, *args, **kwargs):
            frame = traceback.extract_stack(limit=2)[0]
            calls.append((name, fit.state.global_step, f"{frame.filename}:{frame.lineno}"))
            return original(self, *args, **kwargs)
        return wrapper

    for name in _SYNCS:
        monkeypatch.setattr(torch.Tensor, name, counting(name, getattr(torch.Tensor, name)))


class LogsTensor(Regression):
    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("mse", loss, prog_bar=True)  # a tensor: stays on the device until a logging step
        return loss


@pytest.mark.parametrize("optim", ["sgd", "adamw_torch"])
def test_no_host_sync_on_steps_that_do_not_log_DESIGN_hot_path(tmp_path, monkeypatch, optim):
    """F-OBS-1 / DESIGN.md hot path: during 20 steps with ``logging_steps=10`` (eval off, progress bar off),
    tensor-to-host conversions (``.item()``, ``float()``, ``bool()``, ``int()``, ``.tolist()``) happen only on
    the logging steps 10 and 20 (plus the sampler's order at the start of the epoch), a small bounded number.
    With AdamW, torch's own bookkeeping (``step.item()`` on CPU step counters inside ``torch/optim``) is left
    out of the count."""
    calls: list[tuple[str, int, str]] = []
    fit = _fit(tmp_path, max_steps=20, logging_steps=10, optim=optim)
    module = LogsTensor()
    _count_syncs(monkeypatch, fit, calls)
    fit.fit(module, _data(40))
    monkeypatch.undo()
    calls = [c for c in calls if "torch/optim/" not in c[2]]
    steps = {step for _, step, _ in calls}
    assert steps <= {0, 10, 20}, calls
    assert len([c for c in calls if c[1] == 0]) <= 2, calls
    assert len(calls) <= 13, calls  # 12, plus the end of fit's one finite check of the weights (once per run)
    assert [h["mse"] for h in _history(fit, "loss")]  # the logged tensor was converted on the logging steps


def test_no_host_sync_with_token_level_accumulation_DESIGN_hot_path(tmp_path, monkeypatch):
    """DESIGN.md hot path + F-LOOP-2: exact accumulation over token counts (``labels != -100``) needs the counts
    of the window's micro-batches, but not on the host: the weights can stay tensors. 20 steps of 2 micro-batches
    with ``logging_steps=10`` must not convert anything to host numbers outside the logging steps."""

    # kept local: a loss over masked (-100) token labels, the per-step tensors a sync would read
    class Tokens(TaskModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.layer = nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            pred = self.layer(batch["x"]).squeeze(-1)
            mask = batch["labels"] != -100
            return ((pred - batch["labels"].float()) ** 2)[mask].mean()

    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 3, (80, 5), generator=g)
    labels[torch.rand(80, 5, generator=g) < 0.3] = -100
    data = [{"x": torch.randn(5, 3, generator=g), "labels": labels[i]} for i in range(80)]
    calls: list[tuple[str, int, str]] = []
    fit = _fit(tmp_path, max_steps=20, logging_steps=10, gradient_accumulation_steps=2, optim="sgd")
    _count_syncs(monkeypatch, fit, calls)
    fit.fit(Tokens(), data)
    monkeypatch.undo()
    assert {step for _, step, _ in calls} <= {0, 10, 20}, calls
    assert len(calls) <= 12, calls
