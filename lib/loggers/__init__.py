"""Loggers by name (``report_to``)."""

from taskfit.loggers.csv_logger import CSVLogger
from taskfit.loggers.logger import Logger

__all__ = ["CSVLogger", "Logger"]
