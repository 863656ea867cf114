"""What the loggers receive under ``taskfit.lightning.Trainer``, equal to ``lightning.Trainer`` for the same module
(scenarios after Lightning's tests_pytorch/trainer/logging_/test_distributed_logging.py and
test_eval_loop_logging.py::test_eval_step_logging): the default checkpoint folder taken from the first logger,
the calls a logger gets as training starts and after a save, and each evaluation batch's step values."""

import os
import warnings
from unittest.mock import Mock

import pytest
import torch

from harness import data, linear, recording_logger
from two_doors import frameworks


def _trainer(L, root, **kw):
    opts = dict(default_root_dir=str(root), max_epochs=1, limit_train_batches=1, limit_val_batches=1,
                enable_model_summary=False, enable_progress_bar=False, accelerator="cpu", devices=1)
    opts.update(kw)
    return L.Trainer(**opts)


def _files(root):
    """Every file and folder under ``root`` (relative), the taskfit checkpoint folders' contents left out."""
    out = []
    for here, dirs, files in os.walk(root):
        rel = os.path.relpath(here, root)
        if ".ckpt" in rel:
            continue
        out += [os.path.normpath(os.path.join(rel, n)) for n in dirs + files]
    return sorted(out)


def test_F_LIT_LOG_mock_logger_checkpoint_folder_and_start_calls_like_lightning(tmp_path):
    """A ``Mock`` logger: the default ``ModelCheckpoint`` saves into ``save_dir/name/version/checkpoints`` (its
    folder resolved at setup, from the logger's attributes, not ``log_dir``); the logger gets ``log_graph(model)``
    and ``save()`` as training starts and ``after_save_checkpoint`` after the save, in Lightning's order."""
    got = {}
    for name, L in frameworks().items():
        root = tmp_path / name
        root.mkdir()
        logger = Mock()
        logger.version, logger.name, logger.save_dir = "0", "name", str(root)
        seen = {}

        class Watch(L.Callback):
            def setup(self, trainer, pl_module, stage):
                seen["setup"] = [c[0] for c in trainer.logger.method_calls]

            def on_train_start(self, trainer, pl_module):
                seen["train_start"] = [c[0] for c in trainer.logger.method_calls]
                seen["graph_of"] = trainer.logger.log_graph.call_args.args[0] is pl_module

        trainer = _trainer(L, root, logger=logger, callbacks=[Watch()])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(linear(L.LightningModule)(), data())
        calls = [c[0] for c in logger.method_calls if c[0] != "log_hyperparams"]  # taskfit logs its arguments
        got[name] = (seen, calls, os.path.relpath(trainer.checkpoint_callback.dirpath, root), _files(root))
    assert got["lightning"][1] == ["log_graph", "save", "after_save_checkpoint", "finalize"]
    assert got["lightning"][0] == {"setup": [], "train_start": ["log_graph", "save"], "graph_of": True}
    assert got["taskfit"][0]["setup"] == [] and got["taskfit"][0]["graph_of"]
    assert got["taskfit"][1:] == got["lightning"][1:]
    assert got["taskfit"][2] == os.path.join("name", "0", "checkpoints")


@pytest.mark.parametrize("kind", ["CSVLogger", "TensorBoardLogger", None])
def test_F_LIT_LOG_file_logger_checkpoint_folders_like_lightning(tmp_path, kind):
    """Lightning's own file loggers (and no logger): the default checkpoint folder and the files written stay
    where Lightning puts them (``lightning_logs/version_0/checkpoints``, ``checkpoints``)."""
    if kind == "TensorBoardLogger":
        pytest.importorskip("tensorboard")
    got = {}
    for name, L in frameworks().items():
        root = tmp_path / name
        logger = getattr(L.pytorch.loggers if name == "lightning" else L.loggers, kind)(root) if kind else False
        trainer = _trainer(L, root, logger=logger)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(linear(L.LightningModule)(), data())
        # TensorBoard's event file names hold the time; Lightning's TensorBoardLogger.save() also writes an empty
        # hparams.yaml, taskfit's writes its hyperparameters into the events only
        files = [f for f in _files(root) if "events.out" not in f and not (kind == "TensorBoardLogger" and
                                                                           f.endswith("hparams.yaml"))]
        got[name] = (os.path.relpath(trainer.checkpoint_callback.dirpath, root), files)
    assert got["taskfit"] == got["lightning"]


def test_F_LIT_LOG_eval_step_values_reach_loggers_like_lightning(tmp_path):
    """``self.log(on_step=True)`` in ``validation_step``/``test_step`` with two loaders: each batch's value goes to
    the loggers (``name/dataloader_idx_N``, ``name_step`` when also ``on_epoch``) at Lightning's evaluation step
    (the loader's batches so far: counted over the whole ``fit``, anew in ``validate``/``test``), none during the
    sanity check, next to the training and epoch rows; the same rows in the same order as Lightning's."""
    got = {}
    for name, L in frameworks().items():
        class M(linear(L.LightningModule)):
            def training_step(self, batch, batch_idx):
                loss = super().training_step(batch, batch_idx)
                self.log("loss", loss)
                return loss

            def validation_step(self, batch, batch_idx, dataloader_idx=0):
                x, y = batch
                self.log("v", float(batch_idx + 10 * dataloader_idx), on_step=True, on_epoch=False)
                self.log("mse", torch.nn.functional.mse_loss(self.layer(x), y), on_step=True)

            def test_step(self, batch, batch_idx, dataloader_idx=0):
                self.log("t", float(batch_idx), on_step=True, on_epoch=False)

        logger = recording_logger()  # a logger of the user's own (Lightning's Logger class) in both
        trainer = _trainer(L, tmp_path / name, logger=logger, max_epochs=2, limit_train_batches=2,
                           limit_val_batches=3, enable_checkpointing=False, log_every_n_steps=1,
                           num_sanity_val_steps=1)
        torch.manual_seed(0)
        module = M()
        loaders = [data(8), data(8, seed=1)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(module, data(), loaders)
            trainer.validate(module, loaders)
            trainer.test(module, loaders[:1])
        got[name] = logger.rows
    for (s_l, row_l), (s_t, row_t) in zip(got["lightning"], got["taskfit"]):
        assert s_t == s_l and row_t.keys() == row_l.keys()
        assert row_t == pytest.approx(row_l, rel=1e-6)
    assert len(got["taskfit"]) == len(got["lightning"])
    # fit's two validations count on (0, 1 then 2, 3), validate counts anew; the sanity batch is not counted
    assert [s for s, r in got["taskfit"] if "v/dataloader_idx_0" in r] == [0, 1, 2, 3, 0, 1]
    assert [r for _, r in got["taskfit"]][-2:] == [{"t": 0.0}, {"t": 1.0}]


def test_F_LIT_LOG_start_calls_in_every_trainer_method_like_lightning(tmp_path):
    """``validate``/``test``/``predict`` start with Lightning's ``_log_hyperparams`` calls too, and
    ``log_hyperparams`` receives the module's ``save_hyperparameters`` values (only those); the same calls, in the
    same order and with the same arguments, as Lightning's."""
    from two_doors import with_evaluation

    got = {}
    for name, L in frameworks().items():
        class M(with_evaluation(linear)(L.LightningModule)):
            def __init__(self, width=4):
                super().__init__()
                self.save_hyperparameters()

            def predict_step(self, batch, batch_idx):
                return self.layer(batch[0])

        logger = Mock()
        logger.version, logger.name, logger.save_dir = "0", "name", str(tmp_path / name)
        trainer = _trainer(L, tmp_path / name, logger=logger, enable_checkpointing=False)
        module = M()
        calls = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(module, data())
            calls.append([(c[0], c.args[:1] if c[0] == "log_hyperparams" else ()) for c in logger.method_calls
                          if c[0] != "log_metrics"])
            for fn in ("validate", "test", "predict"):
                logger.reset_mock()
                getattr(trainer, fn)(module, data(8))
                calls.append([c[0] for c in logger.method_calls])
        got[name] = calls
    assert got["taskfit"] == got["lightning"]
    assert got["lightning"][0][:3] == [("log_hyperparams", ({"width": 4},)), ("log_graph", ()), ("save", ())]
    assert got["lightning"][3] == ["log_hyperparams", "log_graph", "save", "finalize"]
