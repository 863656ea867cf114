"""``setup(stage)`` / ``teardown(stage)`` of the module, the datamodule and the callbacks receive Lightning's
``TrainerFn`` member (a str Enum equal to ``"fit"``, ``"validate"``, ``"test"``, ``"predict"``), and
``trainer.state.fn`` / ``.stage`` / ``.status`` read as Lightning's enums, under both Trainers."""

import warnings

import torch
from torch.utils.data import DataLoader

from harness import data, linear, regression
from two_doors import frameworks


def _seen(stage):
    return type(stage).__module__, type(stage).__name__, stage.value, stage == "fit", stage == "test"


def _run(L, root):
    seen = []

    class Recorder(L.Callback):
        def setup(self, trainer, pl_module, stage):
            seen.append(("cb.setup",) + _seen(stage))

        def teardown(self, trainer, pl_module, stage):
            seen.append(("cb.teardown",) + _seen(stage))

        def on_train_start(self, trainer, pl_module):
            st = trainer.state
            seen.append(("state", type(st.fn).__name__, st.fn, st.stage, st.status))

    class Data(L.LightningDataModule):
        def setup(self, stage):
            seen.append(("dm.setup",) + _seen(stage))

        def teardown(self, stage):
            seen.append(("dm.teardown",) + _seen(stage))

        def train_dataloader(self):
            return data(n=8)

        def test_dataloader(self):
            return DataLoader(regression(4), batch_size=4)

        def predict_dataloader(self):
            return DataLoader(regression(4), batch_size=2)

    class M(linear(L.LightningModule)):
        def setup(self, stage):
            seen.append(("module.setup",) + _seen(stage))

        def teardown(self, stage):
            seen.append(("module.teardown",) + _seen(stage))

        def test_step(self, batch, batch_idx):
            self.log("t", float(batch_idx))

        def predict_step(self, batch, batch_idx):
            return batch[0].sum()

    trainer = L.Trainer(default_root_dir=str(root), max_epochs=1, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[Recorder()])
    torch.manual_seed(0)
    module, dm = M(), Data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, datamodule=dm)
        trainer.test(module, datamodule=dm, verbose=False)
        trainer.predict(module, datamodule=dm)
        # given loaders: the datamodule attached before still gets its set-up and tear-down hooks (Lightning)
        trainer.predict(module, DataLoader(regression(4), batch_size=2))
    st = trainer.state
    seen.append(("after", st.fn, st.stage, st.status, type(st.status).__name__))
    return seen


def test_F_LIT_STAGE_setup_teardown_receive_trainer_fn_like_lightning(tmp_path):
    """F-LIT-DOOR: ``type(stage)``, ``stage.value``, ``stage == "fit"`` in every ``setup``/``teardown`` of fit, test
    and predict, and ``trainer.state``'s enums, equal to Lightning's (the class is Lightning's own ``TrainerFn``
    once Lightning is imported)."""
    got = {name: _run(L, tmp_path / name) for name, L in frameworks().items()}
    assert got["taskfit"] == got["lightning"]
    stages = [s for s in got["lightning"] if s[0] == "module.setup"]
    assert [s[1:] for s in stages] == [("lightning.pytorch.trainer.states", "TrainerFn", v, v == "fit", v == "test")
                                       for v in ("fit", "test", "predict", "predict")]
    assert [s[0] for s in got["lightning"][-7:-1]] == ["dm.setup", "cb.setup", "module.setup", "dm.teardown",
                                                       "cb.teardown", "module.teardown"]


def test_F_LIT_STAGE_own_enum_without_lightning_imported():
    """Without Lightning imported the door's own str Enums (same values) are used: equal to the names."""
    import sys

    from taskfit.lightning.trainer_state import TrainerFn, peer_enum, trainer_fn

    saved = sys.modules.pop("lightning.pytorch.trainer.states", None)
    try:
        assert peer_enum(TrainerFn) is TrainerFn
        fn = trainer_fn("validate")
        assert fn is TrainerFn.VALIDATING and fn == "validate" and isinstance(fn, str)
    finally:
        if saved is not None:
            sys.modules["lightning.pytorch.trainer.states"] = saved


def test_F_LIT_STAGE_state_equals_lightnings_trainer_state(tmp_path):
    """``trainer.state == TrainerState(...)`` reads as under Lightning, before and after ``fit``."""
    from lightning.pytorch.trainer.states import TrainerFn, TrainerState, TrainerStatus

    got = {}
    for name, L in frameworks().items():
        trainer = L.Trainer(default_root_dir=str(tmp_path / name), max_steps=1, accelerator="cpu", logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        before = trainer.state == TrainerState(status=TrainerStatus.INITIALIZING, fn=None, stage=None)
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(linear(L.LightningModule)(), data(n=8))
        after = trainer.state == TrainerState(status=TrainerStatus.FINISHED, fn=TrainerFn.FITTING, stage=None)
        got[name] = (before, after, trainer.state == TrainerState())
    assert got["taskfit"] == got["lightning"] == (True, True, False)
