"""``DataModule``: the optional bundle of data hooks (mirrors Lightning's ``LightningDataModule``)."""

from __future__ import annotations

import inspect
import os
from collections.abc import Sized
from typing import Any

from lightning_utilities.core.apply_func import apply_to_collection
from taskfit.core.lightning_members import HyperparametersMixin
from torch.utils.data import DataLoader, Dataset, IterableDataset

_LOADERS = (("Train dataloader", "train_dataloader"), ("Validation dataloader", "val_dataloader"),
            ("Test dataloader", "test_dataloader"), ("Predict dataloader", "predict_dataloader"))


class DataModule(HyperparametersMixin):
    """Optional bundle of data hooks (mirrors Lightning's ``LightningDataModule``).

    Override any of :meth:`prepare_data` (download/tokenise once), :meth:`setup` (per stage: ``"fit"``,
    ``"validate"``, ``"test"``, ``"predict"``) and the ``*_dataloader`` methods. A ``*_dataloader`` may return a
    ``DataLoader`` or a map-style/iterable ``Dataset`` (then ``FitArguments`` batch sizes apply).
    :meth:`state_dict` / :meth:`load_state_dict` put the datamodule's own state into checkpoints (under the
    class's qualified name, as Lightning); ``save_hyperparameters`` records ``__init__`` arguments in ``hparams``.
    """

    #: the trainer running this datamodule (set by ``taskfit.lightning.Trainer``; None before)
    trainer: Any = None
    #: ``prepare_data`` on local rank 0 of every node (True) or on global rank 0 only (False), as Lightning
    prepare_data_per_node: bool = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Takes and ignores any arguments, as ``LightningDataModule.__init__`` (so ``from_datasets`` can pass
        ``batch_size``/``num_workers`` to a subclass that does not name them)."""
        super().__init__()

    CHECKPOINT_HYPER_PARAMS_KEY = "datamodule_hyper_parameters"
    CHECKPOINT_HYPER_PARAMS_NAME = "datamodule_hparams_name"
    CHECKPOINT_HYPER_PARAMS_TYPE = "datamodule_hparams_type"

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, map_location: Any = None, hparams_file: str | None = None,
                             weights_only: bool | None = None, **kwargs: Any) -> Any:
        """Build the datamodule from the hyperparameters a checkpoint saved of it (mirrors Lightning's
        ``LightningDataModule.load_from_checkpoint``; ``map_location`` and ``weights_only`` are taken for its
        signature, a datamodule has no tensors to place).

        Args:
            checkpoint_path (str | os.PathLike): a checkpoint folder written while this datamodule ran.
            hparams_file (str | None): a YAML or JSON file whose hyperparameters update the saved ones.
            **kwargs: constructor arguments that override the saved hyperparameters.

        Raises:
            FileNotFoundError: no checkpoint at ``checkpoint_path``.
        """
        from taskfit.core.loading import load_datamodule

        return load_datamodule(cls, checkpoint_path, hparams_file, kwargs)

    def prepare_data(self) -> None: ...
    def setup(self, stage: str) -> None: ...
    def teardown(self, stage: str) -> None: ...
    def train_dataloader(self) -> Any: return None
    def val_dataloader(self) -> Any: return None
    def test_dataloader(self) -> Any: return None
    def predict_dataloader(self) -> Any: return None
    def on_exception(self, exception: BaseException) -> None: ...

    def state_dict(self) -> dict[str, Any]:
        """The datamodule's state saved with a checkpoint (default: empty)."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned, when a run resumes from a checkpoint."""

    @classmethod
    def from_datasets(cls, train_dataset: Any = None, val_dataset: Any = None, test_dataset: Any = None,
                      predict_dataset: Any = None, batch_size: int = 1, num_workers: int = 0,
                      **datamodule_kwargs: Any) -> DataModule:
        """A datamodule whose ``*_dataloader`` methods wrap the given datasets (mirrors
        ``LightningDataModule.from_datasets``).

        Args:
            train_dataset, val_dataset, test_dataset, predict_dataset (Dataset | Iterable[Dataset] | None): a
                dataset or a collection of them per stage; a stage without one keeps the class's method.
            batch_size (int): samples per batch of every loader; passed to ``__init__`` too if it takes it.
            num_workers (int): loader worker processes; passed to ``__init__`` too if it takes it.
            **datamodule_kwargs: further ``__init__`` arguments.

        Returns:
            the datamodule; training loaders shuffle (map-style datasets only), all pin memory.

        Raises:
            TypeError: ``__init__`` misses a required argument (as calling the class would).
        """
        def loader(ds: Dataset, shuffle: bool = False) -> DataLoader:
            shuffle &= not isinstance(ds, IterableDataset)
            return DataLoader(ds, batch_size=batch_size, shuffle=shuffle, num_workers=num_workers, pin_memory=True)

        params = inspect.signature(cls.__init__).parameters
        special = {"batch_size": batch_size, "num_workers": num_workers}
        if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            special = {k: v for k, v in special.items() if k in params and k != "self"}
        dm = cls(**datamodule_kwargs, **special)
        for name, data, shuffle in (("train_dataloader", train_dataset, True), ("val_dataloader", val_dataset, False),
                                    ("test_dataloader", test_dataset, False),
                                    ("predict_dataloader", predict_dataset, False)):
            if data is not None:
                setattr(dm, name, lambda data=data, shuffle=shuffle: apply_to_collection(
                    data, Dataset, loader, shuffle=shuffle))
        return dm

    def __str__(self) -> str:
        """The loaders that are available and their dataset sizes, one line per stage (Lightning's format):
        ``{Train dataloader: size=64}``, ``{Validation dataloader: 1. size=32 ; 2. size=NA}``, ``{Test
        dataloader: None}``..."""
        return os.linesep.join(f"{{{title}: {_loader_summary(self, method)}}}" for title, method in _LOADERS)


def _loader_summary(dm: DataModule, method: str) -> str:
    try:
        loaders = getattr(dm, method)()
    except Exception:  # noqa: BLE001  (a loader that cannot be built yet, before setup, counts as absent: Lightning)
        return "None"
    if loaders is None:
        return "None"

    def size(loader: DataLoader) -> str:
        return f"size={len(loader.dataset)}" if isinstance(loader.dataset, Sized) else "size=NA"

    if isinstance(loaders, DataLoader):
        return size(loaders)
    parts = loaders.values() if isinstance(loaders, dict) else loaders
    return " ; ".join(f"{i}. {size(dl)}" if isinstance(dl, DataLoader) else "None"
                      for i, dl in enumerate(parts, start=1))
