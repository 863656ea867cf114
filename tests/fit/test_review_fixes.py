"""Regression tests for edge cases found in review (F-CORE-5, F-LOOP-6, F-CORE-1, F-CORE-3)."""

import pytest
import torch
from helpers.models import Classifier
from taskfit import EarlyStopping, Fit, TaskModule
from taskfit.callbacks.progress import ProgressBar
from taskfit.loggers import Logger
from torch.utils.data import IterableDataset, TensorDataset


def _ds(n=32):
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 4, generator=g), torch.randint(0, 2, (n,), generator=g))


class M(Classifier):
    """The canonical classifier (4 features, 2 classes, unseeded) raising at batch ``fail_at``, logging ``hidden``
    (``logger=False``) and ``shown`` in training and ``secret`` (``logger=False``) in validation."""

    def __init__(self, fail_at=None):
        super().__init__(features=4, classes=2, seed=None)
        self.fail_at = fail_at

    def training_step(self, batch, batch_idx):
        if batch_idx == self.fail_at:
            raise RuntimeError("boom")
        loss = super().training_step(batch, batch_idx)
        self.log("hidden", loss, logger=False)
        self.log("shown", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y)
        self.log("secret", loss, logger=False)
        return loss


def _fit(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path), disable_tqdm=True, report_to="none", save_strategy="no",
                per_device_train_batch_size=8)
    base.update(kw)
    return Fit(**base)


class Empty(IterableDataset):
    def __iter__(self):
        return iter(())


def test_empty_iterable_dataset_fails_instead_of_hanging_F_CORE_5(tmp_path):
    with pytest.raises(ValueError, match="yielded no batch"):
        _fit(tmp_path, max_steps=4).fit(M(), Empty())


class Recorder(Logger):
    def __init__(self):
        self.rows = []

    def log_metrics(self, metrics, step):
        self.rows.append(dict(metrics))


def test_logger_false_values_stay_out_of_loggers_F_CORE_1(tmp_path):
    rec = Recorder()
    fit = _fit(tmp_path, max_steps=4, logging_steps=1, eval_strategy="steps", eval_steps=2)
    fit.loggers.append(rec)
    fit.fit(M(), _ds(), _ds())
    keys = set().union(*rec.rows)
    assert "shown" in keys and "eval_loss" in keys
    assert "hidden" not in keys and not any("secret" in k for k in keys)
    assert "eval_secret" in fit.validate()  # still returned to the caller


def test_early_stopping_resets_per_run_and_ignores_standalone_validate_F_LOOP_6(tmp_path):
    es = EarlyStopping(monitor="eval_loss", patience=1, threshold=10.0)  # never improves -> stop at 2nd eval
    fit = _fit(tmp_path, num_train_epochs=5, eval_strategy="epoch", callbacks=[es])
    fit.fit(M(), _ds(), _ds())
    assert fit.state.global_step == 8 and es.stopped_step == 8
    fit.validate(metric_key_prefix="test")  # no KeyError, no patience used
    assert es.wait == 1
    fit.fit(M(), _ds(), _ds())  # a second run starts fresh and stops at its own 2nd evaluation
    assert fit.state.global_step == 8


def test_progress_bars_closed_when_fit_raises_F_OBS_1(tmp_path):
    bar = ProgressBar()
    fit = Fit(output_dir=str(tmp_path), max_steps=4, report_to="none", save_strategy="no",
              per_device_train_batch_size=8, callbacks=[bar], disable_tqdm=True)
    with pytest.raises(RuntimeError, match="boom"):
        fit.fit(M(fail_at=2), _ds())
    assert bar.train_bar is None and bar.eval_bar is None


def test_best_checkpoint_recorded_in_the_checkpoint_itself(tmp_path):
    fit = _fit(tmp_path, max_steps=4, eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2,
               metric_for_best_model="loss")
    fit.fit(M(), _ds(), _ds())
    ts = torch.load(tmp_path / "checkpoint-2" / "training_state.pt", weights_only=True)
    assert ts["state"]["best_model_checkpoint"] == str(tmp_path / "checkpoint-2")
    assert ts["state"]["best_global_step"] == 2


def test_hf_style_optimizers_without_scheduler_get_default_schedule_F_LOOP_5(tmp_path):
    m = M()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    fit = _fit(tmp_path, max_steps=4, optimizers=(opt, None))
    fit.fit(m, _ds())
    assert fit.lr_scheduler is not None and opt.param_groups[0]["lr"] == pytest.approx(0.0)  # linear decay to 0


def test_strategy_instance_with_precision_is_a_conflict_F_CORE_3(tmp_path):
    from taskfit.accelerators import CPUAccelerator
    from taskfit.precision import Precision
    from taskfit.strategies import SingleDeviceStrategy

    s = SingleDeviceStrategy(CPUAccelerator(), torch.device("cpu"), Precision())
    with pytest.raises(ValueError, match="owns its precision"):
        Fit(output_dir=str(tmp_path), strategy=s, precision="bf16-mixed")


def test_test_without_steps_and_hf_keyword_aliases_F_EVAL_1(tmp_path):
    # kept local: the module must have neither validation_step nor test_step (the canonical ones validate)
    class NoEval(TaskModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 2)

        def training_step(self, batch, batch_idx):
            return self.lin(batch[0]).sum()

    fit = _fit(tmp_path, max_steps=1)
    with pytest.raises(ValueError, match="has no test_step"):
        fit.test(NoEval(), _ds())
    m = M()
    fit.fit(m, _ds())
    assert "eval_loss" in fit.evaluate(eval_dataset=_ds())
    assert fit.predict(test_dataset=_ds(8)).predictions.shape == (8, 2)
