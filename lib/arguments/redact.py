"""Kept for imports of ``taskfit.arguments.redact``: redaction lives in :mod:`taskfit.redact` (the lowest layer, so
storage, loggers and strategies use it too)."""

from taskfit.redact import SECRET_FIELDS, redact_text, redact_value, shown

__all__ = ["SECRET_FIELDS", "redact_text", "redact_value", "shown"]
