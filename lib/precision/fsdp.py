"""Precision under FSDP2 (``strategy="fsdp"``/``"fsdp2"``): the plugin also gives FSDP its mixed-precision
policy (F-PREC-3)."""

from __future__ import annotations

from typing import Any

import torch

from taskfit.precision.precision import StrategyPrecision


def fsdp_mixed_precision_policy(autocast_dtype: torch.dtype | None) -> Any:
    """``MixedPrecisionPolicy(param_dtype=autocast_dtype, reduce_dtype=float32)`` for a mixed precision (bf16 or
    fp16 all-gathered parameters and compute, gradients reduced in fp32), or the default policy (no casts) for
    ``autocast_dtype=None``."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=autocast_dtype, reduce_dtype=torch.float32 if autocast_dtype else None)


class FSDPPrecision(StrategyPrecision):
    """Every precision name under FSDP2 (mirrors Lightning's ``FSDPPrecision``): as the plain plugins (autocast
    and loss scaling for the mixed names, cast parameters and inputs for the true names), plus
    :meth:`mixed_precision_policy`, which the FSDP strategy hands to ``fully_shard``.

    Args:
        precision (str): ``"32-true"``, ``"64-true"``, ``"bf16-mixed"``, ``"16-mixed"``, ``"bf16-true"`` or
            ``"16-true"``.
        policy (torch.distributed.fsdp.MixedPrecisionPolicy | None): a policy to use instead of the one derived
            from ``precision``.
        scaler (torch.amp.GradScaler | None): as :class:`~taskfit.precision.MixedPrecision`.

    Raises:
        ValueError: an unknown name (with the valid choices).
    """

    def __init__(self, precision: str = "32-true", policy: Any = None, scaler: Any = None) -> None:
        super().__init__(precision, scaler)
        self.policy = policy

    def mixed_precision_policy(self) -> Any:
        """The ``MixedPrecisionPolicy`` for ``fully_shard`` (:func:`fsdp_mixed_precision_policy` of the autocast
        dtype, unless a policy was given)."""
        return self.policy if self.policy is not None else fsdp_mixed_precision_policy(self.autocast_dtype)
