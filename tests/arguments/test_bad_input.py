"""Bad input gives ONE clear error before training work starts (F-CORE-3, F-CORE-4, F-CORE-5, F-CORE-1,
F-CORE-2, F-LOOP-1): the exception type is fixed and the message names the bad value and the valid choices or a
"Did you mean". Each test also checks that no optimizer step was taken (``global_step == 0``) and, where the error
is raised at construction, that no training data was touched."""

from __future__ import annotations

import pytest
import torch
from helpers import models
from taskfit import Fit, FitArguments, TaskModule
from torch import nn
from torch.utils.data import Dataset, IterableDataset, TensorDataset


def _fit(tmp_path, **kwargs) -> Fit:
    opts = {"output_dir": str(tmp_path), "disable_tqdm": True, "report_to": "none", "save_strategy": "no",
            "per_device_train_batch_size": 2, "max_steps": 2}
    opts.update(kwargs)
    return Fit(**opts)


class NoValidation(TaskModule):
    # kept local: the eval-misconfiguration tests need a module without validation_step
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.layer(x).squeeze(-1), y)


def _regression() -> models.Regression:
    """The canonical regression on :func:`_data`'s 4 features, unseeded (the errors come before any value)."""
    return models.Regression(features=4, seed=None)


def _data(n: int = 8) -> TensorDataset:
    return TensorDataset(torch.randn(n, 4), torch.randn(n))


class Touched(Dataset):
    """Records whether any sample was read."""

    def __init__(self) -> None:
        self.read = False

    def __len__(self):
        return 8

    def __getitem__(self, i):
        self.read = True
        return torch.randn(4), torch.randn(())


# --------------------------------------------------------------------------- unknown names: at Fit(...) ---
def test_unknown_fit_option_F_CORE_4():
    """F-CORE-4: ``Fit(max_step=10)`` -> ValueError naming the option with "Did you mean "max_steps"" and only the
    closest names (not the ~200 options); ``FitArguments(num_epochs=3)`` gives the same help, as a TypeError (an
    unexpected keyword) that is also a ValueError; names from other libraries map to ours (``lr``)."""
    with pytest.raises(ValueError) as err:
        Fit(max_step=10)
    msg = str(err.value)
    assert "'max_step'" in msg and 'Did you mean "max_steps"' in msg
    assert "per_device_train_batch_size" not in msg and len(msg) < 250
    with pytest.raises(TypeError, match=r"'num_epochs'\. Did you mean \"num_train_epochs\"\?") as err:
        FitArguments(num_epochs=3)
    assert isinstance(err.value, ValueError) and len(str(err.value)) < 250
    with pytest.raises(ValueError, match='Did you mean "learning_rate"'):
        Fit(lr=1e-3)


@pytest.mark.parametrize("value, suggestion", [("fdsp", "fsdp"), ("singel_device", "single_device"),
                                               ("deepspeed_stage3", "deepspeed_stage_3")])
def test_unknown_strategy_did_you_mean_F_CORE_3(value, suggestion):
    """F-CORE-3: an unknown strategy name -> ValueError with the closest valid name and all valid names."""
    with pytest.raises(ValueError) as err:
        Fit(strategy=value)
    msg = str(err.value)
    assert f"strategy {value!r}" in msg and f'Did you mean "{suggestion}"' in msg
    for name in ("auto", "ddp", "fsdp", "single_device", "deepspeed"):
        assert name in msg


def test_unknown_accelerator_F_CORE_3():
    """F-CORE-3 / F-ACC-1: unknown accelerator -> ValueError naming it, the closest match and the valid kinds."""
    with pytest.raises(ValueError) as err:
        Fit(accelerator="cpux")
    msg = str(err.value)
    assert "accelerator 'cpux'" in msg and 'Did you mean "cpu"' in msg
    assert all(name in msg for name in ("cpu", "cuda", "mps", "xla"))


def test_unknown_precision_F_CORE_3():
    """F-CORE-3 / F-PREC-1: unknown precision -> ValueError with the closest valid name and every valid name."""
    with pytest.raises(ValueError) as err:
        Fit(precision="bf15-mixed")
    msg = str(err.value)
    assert "precision 'bf15-mixed'" in msg and 'Did you mean "bf16-mixed"' in msg
    assert all(name in msg for name in ("32-true", "64-true", "bf16-mixed", "bf16-true", "16-mixed"))


def test_unknown_option_values_F_CORE_4():
    """F-CORE-4: bad values of enumerated options are refused at construction with "Did you mean"."""
    with pytest.raises(ValueError, match=r"eval_strategy 'epochs'\. Did you mean \"epoch\"\?.*no, steps"):
        Fit(eval_strategy="epochs")
    with pytest.raises(ValueError, match="lr_scheduler_type.*'cosin'.*Did you mean \"cosine\""):
        Fit(lr_scheduler_type="cosin")
    with pytest.raises(ValueError, match="optim.*'adamw_troch'.*Did you mean \"adamw_torch\""):
        Fit(optim="adamw_troch")


# ------------------------------------------------------------------------ pending components: at Fit(...) ---
@pytest.mark.skipif(torch.cuda.is_available() or torch.backends.mps.is_available(), reason="a GPU is present")
@pytest.mark.parametrize("kwargs, needle", [
    ({"accelerator": "cuda"}, "accelerator='cuda' is not available"),
    ({"accelerator": "mps"}, "accelerator='mps' is not available"),
])
def test_absent_accelerator_named_F_ACC_1(kwargs, needle):
    """F-ACC-1 (was the #6 pending test): a device kind absent here -> ValueError naming it, before any work."""
    with pytest.raises(ValueError, match=needle):
        Fit(**kwargs)


def test_option_conflicts_fail_at_construction_F_CORE_4(tmp_path):
    """F-CORE-4 / F-STRAT-2: option values that cannot work here fail at ``Fit(...)``, naming them."""
    with pytest.raises(ValueError, match=r"debug='tpu_metrics_debug' reports torch_xla metrics.*'cpu'"):
        Fit(debug="tpu_metrics_debug", report_to="none")
    with pytest.raises(ValueError, match=r"Unknown accelerator_config key\(s\) \['split_batch'\]"):
        Fit(accelerator_config={"split_batch": True}, report_to="none")
    with pytest.raises(ValueError, match="even_batches=False is not supported"):
        Fit(accelerator_config={"even_batches": False}, report_to="none")
    with pytest.raises(ValueError, match="split_batches=True splits each batch of 5 over 2 processes"):
        from taskfit.data.loaders import per_process_batch_size

        per_process_batch_size(FitArguments(split_batches=True, per_device_train_batch_size=5), 2, train=True)
    cfg = tmp_path / "accelerate.json"
    cfg.write_text('{"split_batches": true}')
    assert per_process_batch_size(FitArguments(accelerator_config=str(cfg), per_device_train_batch_size=8), 2,
                                  train=True) == 4  # the same option as a JSON file
    with pytest.raises(FileNotFoundError, match="accelerator_config file 'nope.json' does not exist"):
        Fit(accelerator_config="nope.json", report_to="none")
    assert per_process_batch_size(FitArguments(accelerator_config={"split_batches": True},
                                               per_device_train_batch_size=8), 2, train=True) == 4


def test_single_device_strategy_with_several_devices_F_CORE_3():
    """F-CORE-3: ``strategy="single_device"`` with ``devices=2`` is a conflict named up front."""
    with pytest.raises(ValueError, match="single_device.*devices=2"):
        Fit(strategy="single_device", devices=2, accelerator="cpu")


# --------------------------------------------------------------------------------- bad data: in fit() ---
def test_empty_dataset_F_CORE_5(tmp_path):
    """F-CORE-5: an empty training set -> ValueError saying it is empty, before any step."""
    fit = _fit(tmp_path)
    with pytest.raises(ValueError, match="train dataset is empty"):
        fit.fit(_regression(), TensorDataset(torch.empty(0, 4), torch.empty(0)))
    assert fit.state.global_step == 0


def test_empty_eval_dataset_F_CORE_5(tmp_path):
    """F-CORE-5: an empty eval set -> ValueError naming the eval dataset, before training starts."""
    train = Touched()
    fit = _fit(tmp_path, eval_strategy="steps", eval_steps=1)
    with pytest.raises(ValueError, match="eval dataset is empty"):
        fit.fit(_regression(), train, [])
    assert fit.state.global_step == 0 and not train.read


def test_drop_last_leaves_no_batches_F_CORE_5(tmp_path):
    """F-CORE-5: a dataset smaller than one batch with ``dataloader_drop_last`` -> ValueError naming the cause."""
    fit = _fit(tmp_path, dataloader_drop_last=True, per_device_train_batch_size=16)
    with pytest.raises(ValueError, match="no batches.*dataloader_drop_last"):
        fit.fit(_regression(), _data(8))


def test_data_of_wrong_container_type_F_CORE_5(tmp_path):
    """F-CORE-5: a string / dict as data -> TypeError naming what is accepted and the type received."""
    with pytest.raises(TypeError, match="train dataset must be a torch DataLoader.*got str"):
        _fit(tmp_path).fit(_regression(), "data.csv")
    with pytest.raises(TypeError, match="got dict"):
        _fit(tmp_path).fit(_regression(), {"x": torch.randn(8, 4)})


def test_generator_as_data_F_CORE_5(tmp_path):
    """F-CORE-5: a generator is not a dataset; the error should say so (and point to IterableDataset), not
    surface as ``object of type 'generator' has no len()`` from inside torch."""
    samples = ((torch.randn(4), torch.randn(())) for _ in range(8))
    with pytest.raises(TypeError) as err:
        _fit(tmp_path).fit(_regression(), samples)
    msg = str(err.value)
    assert "train dataset" in msg and "generator" in msg and "IterableDataset" in msg


def test_iterable_dataset_without_max_steps_F_CORE_5(tmp_path):
    """F-CORE-5: an IterableDataset has no length: training without ``max_steps`` -> ValueError saying so."""

    class Stream(IterableDataset):
        def __iter__(self):
            return iter([(torch.randn(4), torch.randn(())) for _ in range(8)])

    fit = _fit(tmp_path, max_steps=-1)
    with pytest.raises(ValueError, match="no length.*max_steps"):
        fit.fit(_regression(), Stream())
    assert fit.state.global_step == 0


def test_string_samples_for_a_plain_model_F_CORE_5(tmp_path):
    """F-CORE-5 / F-CORE-2: a dataset of raw strings with the default collate and a plain model: the error
    should name the problem (samples are str, no tensor in the batch) and the fix (a data_collator/tokenizer),
    not ``forward() takes 2 positional arguments but 9 were given``."""

    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(4, 1)

        def forward(self, x):
            return self.layer(x).mean()

    with pytest.raises((TypeError, ValueError)) as err:
        _fit(tmp_path, per_device_train_batch_size=8).fit(Plain(), ["some text"] * 8)
    msg = str(err.value)
    assert "str" in msg and "collat" in msg


# ------------------------------------------------------------------------ bad training_step returns ---
class Returns(models.Regression):
    """The canonical regression (4 features, unseeded) whose training_step returns ``make(prediction - target)``."""

    def __init__(self, make) -> None:
        super().__init__(features=4, seed=None)
        self.make = make

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.make(self.layer(x).squeeze(-1) - y)


@pytest.mark.parametrize("make, exc, pattern", [
    (lambda d: None, TypeError, ("training_step must return a scalar loss tensor or a dict with key 'loss'; it "
                                "returned NoneType")),
    (lambda d: d.pow(2), ValueError, r"training_step must return a scalar loss; got a tensor of shape \(2,\)"),
    (lambda d: {"los": d.pow(2).mean()}, TypeError, "dict with key 'loss'; it returned dict without a loss"),
    (lambda d: float(d.detach().pow(2).mean()), TypeError, "returned float"),
    (lambda d: d.pow(2).mean().detach(), ValueError, "does not require grad"),
])
def test_bad_training_step_return_F_CORE_1(tmp_path, make, exc, pattern):
    """F-CORE-1: training_step returning None / a non-scalar / a dict without "loss" / a float / a detached loss
    -> one clear error at the first micro-batch; no optimizer step is taken."""
    fit = _fit(tmp_path)
    module = Returns(make)
    before = module.layer.weight.detach().clone()
    with pytest.raises(exc, match=pattern):
        fit.fit(module, _data())
    assert fit.state.global_step == 0
    assert torch.equal(module.layer.weight, before)


# ------------------------------------------------------------------------------- eval misconfiguration ---
@pytest.mark.parametrize("strategy", ["epoch", "steps"])
def test_eval_strategy_without_eval_data_F_LOOP_1(tmp_path, strategy):
    """F-LOOP-1: ``eval_strategy`` other than "no" without eval data -> ValueError before any data is read."""
    train = Touched()
    fit = _fit(tmp_path, eval_strategy=strategy)
    with pytest.raises(ValueError, match=f"eval_strategy='{strategy}' needs eval data"):
        fit.fit(_regression(), train)
    assert not train.read and fit.state.global_step == 0


def test_eval_data_without_validation_step_F_CORE_1(tmp_path):
    """F-CORE-1: eval data for a module that has no validation_step -> ValueError naming the module."""
    train = Touched()
    fit = _fit(tmp_path, eval_strategy="epoch")
    with pytest.raises(ValueError, match="NoValidation has no validation_step"):
        fit.fit(NoValidation(), train, _data())
    assert not train.read


def test_validate_without_validation_step_F_CORE_1(tmp_path):
    """F-CORE-1: ``fit.validate`` on a module without validation_step -> ValueError naming the module."""
    with pytest.raises(ValueError, match="NoValidation has no validation_step"):
        _fit(tmp_path).validate(NoValidation(), _data())


def test_validate_without_data_F_EVAL_1(tmp_path):
    """F-EVAL-1: validate() with no data anywhere -> ValueError saying where data can come from."""
    with pytest.raises(ValueError, match="validate\\(\\) needs eval data"):
        _fit(tmp_path).validate(_regression())


def test_fit_without_model_F_CORE_3(tmp_path):
    """F-CORE-3: no model and no model_init -> ValueError saying how to give one."""
    with pytest.raises(ValueError, match="No model.*model_init"):
        _fit(tmp_path).fit(None, _data())


def test_model_that_is_not_a_module_F_CORE_3(tmp_path):
    """F-CORE-3: a model that is not an nn.Module -> TypeError naming the type."""
    with pytest.raises(TypeError, match="model must be a TaskModule or a torch.nn.Module; got function"):
        _fit(tmp_path).fit(lambda x: x, _data())


# ---------------------------------------------------------------------------------- wrapped plain models ---
def test_wrapped_model_returning_no_loss_F_CORE_2(tmp_path):
    """F-CORE-2: a plain model whose output has no loss (no labels given) -> ValueError naming the batch keys
    and the fixes (include labels, override compute_loss, compute_loss_func)."""

    class LogitsOnly(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(4, 2)

        def forward(self, x, labels=None):
            return {"logits": self.layer(x)}

    data = [{"x": torch.randn(4), "labels": i % 2} for i in range(8)]
    fit = _fit(tmp_path)
    with pytest.raises(ValueError) as err:
        fit.fit(LogitsOnly(), data)
    msg = str(err.value)
    assert "no loss" in msg and "['labels', 'x']" in msg and "compute_loss" in msg
    assert fit.state.global_step == 0


def test_wrapped_model_returning_logits_tensor_F_CORE_2(tmp_path):
    """F-CORE-2: a plain model that returns a logits tensor (not a loss) -> the error should speak about the
    model's output (it has no loss), not about a ``training_step`` the user never wrote."""

    class Logits(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(4, 2)

        def forward(self, x):
            return self.layer(x)

    with pytest.raises(ValueError) as err:
        _fit(tmp_path).fit(Logits(), torch.randn(8, 4))
    msg = str(err.value)
    assert "Logits" in msg and "loss" in msg and "training_step" not in msg


def test_wrapped_model_whose_forward_takes_no_labels_F_CORE_2(tmp_path):
    """F-CORE-2: a plain model with ``forward(x)`` given ``(x, y)`` tuple batches is called as ``model(x, y)``;
    the error should explain that the forward must take the labels and return the loss (or to write a
    TaskModule / compute_loss_func), not just ``forward() takes 2 positional arguments but 3 were given``."""
    with pytest.raises(TypeError) as err:
        _fit(tmp_path).fit(nn.Sequential(nn.Linear(4, 1)), _data())
    msg = str(err.value)
    assert "Sequential" in msg and "label" in msg and "loss" in msg
