"""Differential tests against Lightning: ``ModelCheckpoint`` under the import swap (scenarios after Lightning's
tests_pytorch/checkpointing/test_model_checkpoint.py). The same module and callback arguments under both Trainers give
the same checkpoint names in the folder (Lightning's files, taskfit's checkpoint folders), the same
``best_model_path``, ``best_model_score``, ``best_k_models``, ``kth_best_model_path`` and ``last_model_path``
(relative to the folder), and the same refusals."""

import os
from datetime import timedelta

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset


def _module(base, scores=None, raise_at=None):
    class Net(base):
        def on_fit_end(self):
            if raise_at == "fit_end":
                raise RuntimeError("Trouble!")

        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            if isinstance(raise_at, int) and self.global_step == raise_at:
                raise RuntimeError("Trouble!")
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

        def on_validation_epoch_end(self):
            if scores is not None and not self.trainer.sanity_checking:
                self.log("score", float(scores[self.current_epoch]))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)
    torch.manual_seed(0)
    return Net()


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 4, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=2)


def _run(framework, folder, ckpt_kwargs, scores=None, raise_at=None, **trainer_kwargs):
    if framework == "lightning":
        import lightning.pytorch as pl
        from lightning.pytorch.callbacks import ModelCheckpoint
    else:
        import taskfit.lightning as pl
        from taskfit.lightning.callbacks import ModelCheckpoint
    mc = ModelCheckpoint(dirpath=folder, **ckpt_kwargs)
    opts = dict(max_epochs=3, limit_train_batches=2, limit_val_batches=1, logger=False, enable_progress_bar=False,
                enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=str(folder))
    opts.update(trainer_kwargs)
    trainer = pl.Trainer(callbacks=[mc], **opts)
    trainer.fit(_module(pl.LightningModule, scores, raise_at), _data(), _data())
    return mc


def _view(mc, folder):
    rel = lambda p: os.path.relpath(p, folder) if p else p  # noqa: E731
    return {"files": sorted(os.listdir(folder)), "best": rel(mc.best_model_path), "last": rel(mc.last_model_path),
            "kth": rel(mc.kth_best_model_path), "score": None if mc.best_model_score is None else
            float(mc.best_model_score), "top": {rel(k): float(v) for k, v in mc.best_k_models.items()},
            "state_key": mc.state_key}


CASES = {
    "top2_monitor_min_with_last": dict(monitor="score", save_top_k=2, save_last=True, filename="{epoch}-{score:.1f}"),
    "all_max": dict(monitor="score", mode="max", save_top_k=-1, filename="{epoch}"),
    "none_monitor_latest": dict(save_top_k=1),
    "every_2_steps_all": dict(every_n_train_steps=2, save_top_k=-1, filename="{step}"),
    "every_2_epochs": dict(every_n_epochs=2, save_top_k=-1),
    "top0_last_only": dict(save_top_k=0, save_last=True),
    "no_metric_name": dict(monitor="score", auto_insert_metric_name=False, filename="e{epoch}-s{score:.2f}"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_F_LIT_CKPT_names_and_attributes_match_lightning(case, tmp_path):
    scores = [0.3, 0.1, 0.2]
    a = _view(_run("lightning", tmp_path / "a", CASES[case], scores), tmp_path / "a")
    b = _view(_run("taskfit", tmp_path / "b", CASES[case], scores), tmp_path / "b")
    assert a == b
    assert all(os.path.isdir(tmp_path / "b" / f) for f in b["files"])  # taskfit's checkpoint folders


def test_F_LIT_CKPT_version_counter_on_rerun_and_resume_from_best(tmp_path):
    """A second run into the same folder adds ``-v1`` (or overwrites with ``enable_version_counter=False``), and the
    best checkpoint resumes under the door."""
    views = {}
    for fw in ("lightning", "taskfit"):
        folder = tmp_path / fw
        for _ in range(2):
            mc = _run(fw, folder, dict(monitor="epoch", save_top_k=-1, filename="{epoch}"), max_epochs=2)
        names = sorted(os.path.basename(p) for p in mc.best_k_models)
        mc2 = _run(fw, tmp_path / (fw + "_off"), dict(save_last=True, enable_version_counter=False), max_epochs=1)
        mc2 = _run(fw, tmp_path / (fw + "_off"), dict(save_last=True, enable_version_counter=False), max_epochs=1)
        views[fw] = (sorted(os.listdir(folder)), names, sorted(os.listdir(tmp_path / (fw + "_off"))))
    assert views["lightning"] == views["taskfit"]
    assert views["taskfit"][1] == ["epoch=0-v1.ckpt", "epoch=1-v1.ckpt"]

    import taskfit.lightning as pl
    trainer = pl.Trainer(max_epochs=3, limit_train_batches=2, limit_val_batches=1, logger=False,
                         enable_progress_bar=False, enable_checkpointing=False, default_root_dir=str(tmp_path))
    trainer.fit(_module(pl.LightningModule), _data(), _data(), ckpt_path=str(tmp_path / "taskfit" / "epoch=1.ckpt"))
    assert trainer.global_step == 6 and trainer.current_epoch == 3


def test_F_LIT_CKPT_save_on_exception_and_link(tmp_path):
    """``save_on_exception`` writes ``<filename>.ckpt`` when training raises; ``save_last="link"`` makes ``last.ckpt``
    a relative link to the newest checkpoint; both as Lightning."""
    seen = {}
    for fw in ("lightning", "taskfit"):
        folder = tmp_path / fw
        with pytest.raises(RuntimeError, match="Trouble!"):
            _run(fw, folder, dict(filename="exception", save_on_exception=True, every_n_epochs=7), raise_at=3)
        with pytest.raises(RuntimeError, match="Trouble!"):  # also from the end hooks (Lightning)
            _run(fw, tmp_path / (fw + "_end"), dict(filename="exception", save_on_exception=True, every_n_epochs=7),
                 raise_at="fit_end")
        assert os.listdir(tmp_path / (fw + "_end")) == ["exception.ckpt"]
        link_dir = tmp_path / (fw + "_link")
        _run(fw, link_dir, dict(save_last="link", save_top_k=1), max_epochs=2)
        seen[fw] = (sorted(os.listdir(folder)), sorted(os.listdir(link_dir)), os.readlink(link_dir / "last.ckpt"))
    assert seen["lightning"] == seen["taskfit"] == (["exception.ckpt"], ["epoch=1-step=4.ckpt", "last.ckpt"],
                                                     "epoch=1-step=4.ckpt")


REFUSED = [dict(save_top_k=-3), dict(every_n_epochs=-3), dict(every_n_train_steps=-3),
           dict(every_n_train_steps=1, every_n_epochs=2), dict(train_time_interval=timedelta(minutes=1),
                                                              every_n_epochs=2),
           dict(save_top_k=3), dict(mode="unknown_option")]


@pytest.mark.parametrize("kwargs", REFUSED, ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()))
def test_F_LIT_CKPT_refusals_with_lightnings_messages(kwargs, tmp_path):
    """Lightning raises MisconfigurationException, taskfit ValueError; the message is the same."""
    from lightning.pytorch.callbacks import ModelCheckpoint as LightningCheckpoint
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

    from taskfit.lightning.callbacks import ModelCheckpoint

    with pytest.raises(MisconfigurationException) as a:
        LightningCheckpoint(dirpath=tmp_path, **kwargs)
    with pytest.raises(ValueError) as b:
        ModelCheckpoint(dirpath=tmp_path, **kwargs)
    assert str(a.value) == str(b.value)


def test_F_LIT_CKPT_format_state_and_yaml_match_lightning(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint as LightningCheckpoint

    from taskfit.lightning.callbacks import ModelCheckpoint

    for kwargs, metrics, extra in (
            (dict(filename="{epoch:03d}-{epoch_test:03d}"), {"epoch": 3, "epoch_test": 3}, {}),
            (dict(filename="{epoch}_{val/loss:.5f}"), {"epoch": 4, "val/loss": 0.03}, {}),
            (dict(filename="name"), {}, dict(ver=3)), (dict(filename="name"), {}, dict(prefix="test")),
            (dict(), {"epoch": 3, "step": 2}, {}), (dict(dirpath="~/ckpts"), {"epoch": 1}, {})):
        kwargs = {"dirpath": tmp_path, **kwargs}
        a, b = LightningCheckpoint(**kwargs), ModelCheckpoint(**kwargs)
        assert a.format_checkpoint_name(dict(metrics), **extra) == b.format_checkpoint_name(dict(metrics), **extra)
        assert a.state_key == b.state_key and a.dirpath == b.dirpath
    a, b = LightningCheckpoint(dirpath=tmp_path / "a"), ModelCheckpoint(dirpath=tmp_path / "b")
    for cb in (a, b):
        cb.best_k_models = {"x.ckpt": torch.tensor(0.5)}
        cb.to_yaml(tmp_path / f"{id(cb)}.yaml")
    assert (tmp_path / f"{id(a)}.yaml").read_text() == (tmp_path / f"{id(b)}.yaml").read_text()
    assert set(a.state_dict()) <= set(b.state_dict())


def test_F_LIT_CKPT_on_save_checkpoint_sees_epoch_step_and_scheduler_states(tmp_path):
    """``on_save_checkpoint(checkpoint)`` reads Lightning's ``epoch``, ``global_step`` and ``lr_schedulers`` (the
    states after this step's scheduler steps), for epoch and step intervals and step-triggered saves."""
    def run(fw, every, epoch_interval):
        pl = __import__("lightning.pytorch" if fw == "lightning" else "taskfit.lightning", fromlist=["Trainer"])
        cb = __import__(f"{pl.__name__}.callbacks", fromlist=["ModelCheckpoint"])

        class Net(type(_module(pl.LightningModule))):
            seen: list = []

            def configure_optimizers(self):
                o = torch.optim.SGD(self.parameters(), lr=1)
                c = {"scheduler": torch.optim.lr_scheduler.StepLR(o, 1, gamma=10)}
                return [o], [c if epoch_interval else {**c, "interval": "step"}]

            def on_save_checkpoint(self, ckpt):
                s = ckpt["lr_schedulers"][0]
                self.seen.append((ckpt["epoch"], ckpt["global_step"], s["_step_count"], s["_last_lr"]))

        torch.manual_seed(0)
        m, folder = Net(), tmp_path / f"{fw}{every}{epoch_interval}"
        m.seen = []
        pl.Trainer(default_root_dir=str(folder), enable_progress_bar=False, logger=False, max_epochs=1,
                   limit_train_batches=2, limit_val_batches=1, enable_model_summary=False, num_sanity_val_steps=0,
                   callbacks=[cb.ModelCheckpoint(dirpath=folder, every_n_train_steps=every)]).fit(m, _data(), _data())
        return m.seen

    for every, epoch_interval in ((None, True), (2, False), (2, True)):
        assert run("lightning", every, epoch_interval) == run("taskfit", every, epoch_interval)
