"""``lightning.pytorch.seed_everything`` (``lightning.fabric.utilities.seed``): Lightning's signature and defaults over
:func:`taskfit.seed.seed_everything`."""

import os
import warnings
from typing import Optional

from taskfit.seed import seed_everything as _seed_all

_MAX, _MIN = 2**32 - 1, 0


def seed_everything(seed: Optional[int] = None, workers: bool = False, verbose: bool = True) -> int:
    """Seed ``random``, ``numpy`` and ``torch`` and set ``PL_GLOBAL_SEED`` (``PL_SEED_WORKERS`` with ``workers``),
    as Lightning's ``seed_everything``.

    Args:
        seed (int | None): the seed; None: ``PL_GLOBAL_SEED`` from the environment, else 0 (with Lightning's
            "No seed found" warning when ``verbose``).
        workers (bool): record that data loader workers should be seeded (``PL_SEED_WORKERS=1``).
        verbose (bool): warn when no seed was found.

    Returns:
        int: the seed used.

    Raises:
        ValueError: a seed that is not an int in [0, 2**32 - 1] (Lightning's range).
    """
    if seed is None:
        env = os.environ.get("PL_GLOBAL_SEED")
        if env is None:
            seed = 0
            if verbose:
                warnings.warn(f"No seed found, seed set to {seed}", UserWarning, stacklevel=2)
        else:
            seed = env
    try:
        seed = int(seed)
    except (TypeError, ValueError):
        raise ValueError(f"Invalid seed specified: {seed!r}; it must be an int in [{_MIN}, {_MAX}].") from None
    if not _MIN <= seed <= _MAX:
        raise ValueError(f"{seed} is not in bounds, numpy accepts from {_MIN} to {_MAX}")
    os.environ["PL_GLOBAL_SEED"] = str(seed)
    os.environ["PL_SEED_WORKERS"] = f"{int(workers)}"
    _seed_all(seed)
    return seed
