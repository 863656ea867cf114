"""Precision on XLA devices (``strategy="xla"``/``"xla_fsdp"``)."""

from __future__ import annotations

from taskfit.precision.precision import StrategyPrecision


class XLAPrecision(StrategyPrecision):
    """Precision on XLA devices (mirrors Lightning's ``XLAPrecision``): ``"bf16-mixed"`` autocasts to bfloat16
    on the XLA device, the true names cast parameters and inputs; XLA has no ``GradScaler``, so ``"16-mixed"`` is
    not offered (use ``"bf16-mixed"``). Chosen by the connector for the XLA strategies.

    Args:
        precision (str): ``"32-true"``, ``"bf16-mixed"``, ``"bf16-true"``, ``"16-true"`` or ``"64-true"``.

    Raises:
        ValueError: ``"16-mixed"`` or an unknown name (with the valid choices).
    """

    names = ("32-true", "64-true", "bf16-mixed", "bf16-true", "16-true")

    def __init__(self, precision: str = "32-true") -> None:
        if precision == "16-mixed":
            raise ValueError("precision='16-mixed' is not supported on 'xla' devices (XLA has no GradScaler for "
                             "loss scaling); use 'bf16-mixed'.")
        super().__init__(precision)
