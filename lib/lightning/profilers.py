"""Lightning's profilers under Lightning's names (``lightning.pytorch.profilers``): swap
``from lightning.pytorch.profilers import X`` for ``from taskfit.lightning.profilers import X``. ``Trainer(profiler=
"simple")`` (or ``"advanced"``, ``"pytorch"``) gives these classes; ``trainer.profiler`` is a
``PassThroughProfiler`` without one."""

from taskfit.callbacks.profilers import (
    AdvancedProfiler,
    PassThroughProfiler,
    Profiler,
    PyTorchProfiler,
    SimpleProfiler,
)

__all__ = ["AdvancedProfiler", "PassThroughProfiler", "Profiler", "PyTorchProfiler", "SimpleProfiler"]
