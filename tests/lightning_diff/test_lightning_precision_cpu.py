"""``Trainer(precision="16-mixed")`` (and the old spellings ``16``, ``"16"``) on the CPU: Lightning warns that AMP
with fp16 is not supported there and runs ``"bf16-mixed"``; the door does the same (``Fit`` keeps fp16 with a CPU
``GradScaler``)."""

import warnings

import pytest
import torch

from harness import data, linear
from two_doors import frameworks


def _train(L, root, precision, accelerator):
    trainer = L.Trainer(default_root_dir=str(root), max_steps=3, accelerator=accelerator, devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        precision=precision)
    torch.manual_seed(0)
    module = linear(L.LightningModule)()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module, data(n=16))
    return module.state_dict(), trainer.precision


@pytest.mark.parametrize("precision", ["16-mixed", 16, "16"])
def test_F_LIT_PREC_16_mixed_on_cpu_runs_bf16_like_lightning(tmp_path, precision):
    """F-LIT-DOOR: the same warnings (text and order), ``trainer.precision == "bf16-mixed"`` and bitwise equal
    weights after 3 steps as ``lightning.Trainer``; ``accelerator="auto"`` finds the CPU here too."""
    got = {}
    for name, L in frameworks().items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            L.Trainer(precision=precision, accelerator="cpu", logger=False, enable_progress_bar=False)
        said = [str(w.message) for w in caught if "precision" in str(w.message)]
        got[name] = (said,) + _train(L, tmp_path / name, precision, "cpu")
    (said_l, w_l, p_l), (said_t, w_t, p_t) = got["lightning"], got["taskfit"]
    assert said_t == said_l and any("Using `precision='bf16-mixed'` instead" in s for s in said_l)
    assert p_t == p_l == "bf16-mixed"
    assert w_t.keys() == w_l.keys() and all(torch.equal(w_t[k], w_l[k]) for k in w_l)


def test_F_LIT_PREC_fit_keeps_fp16_on_cpu(tmp_path):
    """``Fit(precision="16-mixed")`` on the CPU still runs fp16 autocast with a loss scaler (HF's door unchanged);
    the door with an explicit ``MixedPrecision("16-mixed")`` plugin too, as Lightning with its plugin object."""
    from taskfit import Fit
    from taskfit.precision.precision import MixedPrecision, cpu_grad_scaler_supported

    if not cpu_grad_scaler_supported():
        pytest.skip("no GradScaler on CPU in this torch")
    fit = Fit(output_dir=str(tmp_path / "fit"), report_to="none", accelerator="cpu", precision="16-mixed",
              disable_tqdm=True, save_strategy="no")
    assert fit.strategy.precision.name == "16-mixed"
    import taskfit.lightning as L

    plugin = MixedPrecision("16-mixed")
    trainer = L.Trainer(default_root_dir=str(tmp_path / "door"), accelerator="cpu", logger=False,
                        enable_progress_bar=False, plugins=[plugin])
    assert trainer.strategy.precision is plugin and plugin.name == "16-mixed"


def test_F_LIT_PREC_parsed_as_lightning_parses_it():
    """The flag as Lightning's connector leaves it: aliases, the CPU rule, and no CPU rule where a DeepSpeed/FSDP
    strategy (or a Strategy object) picks its own plugin, or for a plugin object."""
    from taskfit.lightning.flags import lightning_precision

    assert lightning_precision(32, "cpu") == ("32-true", [])
    assert lightning_precision("bf16", "cpu")[0] == "bf16-mixed"
    from taskfit.accelerators import choose_accelerator

    on_cpu = choose_accelerator("auto")[0] == "cpu"
    assert lightning_precision("16-mixed", "auto")[0] == ("bf16-mixed" if on_cpu else "16-mixed")
    assert lightning_precision("16-mixed", "cpu", "deepspeed") == ("16-mixed", [])
    assert lightning_precision("16-mixed", "cpu", object()) == ("16-mixed", [])
    plugin = object()
    assert lightning_precision(plugin, "cpu") == (plugin, [])
