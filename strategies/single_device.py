"""One process on one device (``strategy="auto"`` with one device, ``"single_device"``)."""

from __future__ import annotations

from taskfit.strategies.strategy import Strategy


class SingleDeviceStrategy(Strategy):
    """Train in this process on one device. Mirrors Lightning's ``SingleDeviceStrategy`` (F-STRAT-1).

    Everything is inherited: the base class already implements the single-process case, collectives are the
    identity and rank zero writes the checkpoints.
    """

    name = "single_device"
