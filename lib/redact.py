"""The one place credentials are taken out of text: option values written to files, every message, warning or
log line that shows an option value, a path or a URL, every record of the ``taskfit`` logger (a filter installed
when ``taskfit`` is imported) and the text of an error that leaves a stage (:func:`redact_exception`). Nothing here
changes an option itself. It sits in the lowest layer so that every package (storage, loggers, strategies) uses it.

- a set value of a secret option (``hub_token``, ``push_to_hub_token``) or of any key naming a credential
  (``token``, ``secret``, ``password``, ``api_key``, ``access_key``, ``credentials``, ... inside dict options such as
  DeepSpeed / FSDP configs or storage options) becomes ``"<NAME>"``;
- a password in a URL (``s3://user:pass@host``, also without the scheme) becomes ``<REDACTED>``;
- inside free text (a JSON or ``key=value`` string that failed to parse), the value after such a key becomes
  ``<REDACTED>``.
"""

from __future__ import annotations

import logging
import re
from typing import Any

SECRET_FIELDS = ("hub_token", "push_to_hub_token")

#: words that make a key a credential's; not ``tokens`` (``max_new_tokens``, ``train_tokens_per_second``),
#: ``token_id``, ``tokenizer`` or ``author``: metric and option names that must stay readable in logs and errors
_KEY_WORDS = r"token(?!s|iz|_id|_type)|secret|passw|api[_-]?key|access[_-]?key|private[_-]?key|credential|auth(?!or)"
_SECRET_KEY = re.compile(_KEY_WORDS, re.IGNORECASE)
#: ``user:password@host`` with or without a scheme: ``s3://user:pw@bucket``, and the ``"user:pw@host"`` a storage
#: library's error keeps of it once the scheme is split off
_URL_PASSWORD = re.compile(r"(?P<head>(?:[a-z][a-z0-9+.-]*://)?[^/\s:@\"'<>]+:)[^/\s@\"'<>]+@(?=[\w.\[-])",
                           re.IGNORECASE)
#: ``"aws_secret_key": "v"``, ``'token': 'v'``, ``password=v``, ``api_key: v`` inside a string
_KEYED_VALUE = re.compile(
    rf"(?P<key>[\w.-]*(?:{_KEY_WORDS})[\w.-]*)"
    r"(?P<quote>[\"']?)(?P<sep>\s*[:=]\s*)(?P<open>[\"']?)(?P<value>[^\"',;}\]\s]+)", re.IGNORECASE)


def redact_text(text: str) -> str:
    """``text`` with URL passwords and the values of credential-named keys (``"token": "..."``, ``password=...``)
    replaced by ``<REDACTED>``; for free text that may hold an option value (an unparsable JSON string)."""
    text = _URL_PASSWORD.sub(lambda m: m.group("head") + "<REDACTED>@", text)
    return _KEYED_VALUE.sub(lambda m: f"{m.group('key')}{m.group('quote')}{m.group('sep')}{m.group('open')}<REDACTED>",
                            text)


def redact_value(name: str, value: Any) -> Any:
    """``value`` of option (or key) ``name`` with credentials replaced: a set value of a secret option
    (``hub_token``) or of any key that names a credential (``token``, ``secret``, ``password``, ``api_key``,
    ``access_key``, ``credentials``, ... inside dict options such as storage options) becomes ``"<NAME>"``;
    passwords in URLs (``s3://user:pass@host``) become ``<REDACTED>``; dicts and lists are redacted recursively.

    Args:
        name (str): the option or key name.
        value (Any): its value (not changed).

    Returns:
        Any: a redacted copy (the same object when there is nothing to redact in a non-container value).
    """
    if value is None:
        return None
    if name in SECRET_FIELDS or (_SECRET_KEY.search(str(name)) and not isinstance(value, (bool, dict, list))):
        return f"<{str(name).upper()}>"
    if isinstance(value, dict):
        return {k: redact_value(str(k), v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_value(name if not isinstance(v, (dict, list)) else "", v) for v in value)
    if isinstance(value, str):
        return _URL_PASSWORD.sub(lambda m: m.group("head") + "<REDACTED>@", value)
    return value


def shown(name: str, value: Any) -> str:
    """``repr`` of option ``name``'s value for a message, warning or log line, credentials redacted
    (:func:`redact_value`, and :func:`redact_text` over the result for strings that hold keyed credentials)."""
    return redact_text(repr(redact_value(name, value)))


def redact_exception(exc: BaseException) -> BaseException:
    """Take credentials out of the text of ``exc`` and of the errors it was raised from (``__cause__``,
    ``__context__``), in place: string arguments (what ``str(exc)`` and a traceback print) and an ``OSError``'s
    file names. Used where an error leaves a ``Fit`` stage, so an error of a storage or tracking library that
    names ``s3://user:password@host/...`` prints no password.

    Args:
        exc (BaseException): the error (changed in place).

    Returns:
        BaseException: ``exc``.
    """
    seen: set[int] = set()
    err: BaseException | None = exc
    while err is not None and id(err) not in seen and len(seen) < 64:  # a chain can loop back on itself
        seen.add(id(err))
        try:
            err.args = tuple(redact_text(a) if isinstance(a, str) else a for a in err.args)
            if isinstance(err, OSError):
                for attr in ("filename", "filename2"):
                    if isinstance(getattr(err, attr), str):
                        setattr(err, attr, redact_text(getattr(err, attr)))
        except (AttributeError, TypeError):  # an error type with read-only arguments: leave it
            pass
        err = err.__cause__ or err.__context__
    return exc


class RedactingFilter(logging.Filter):
    """A ``logging.Filter`` that passes every record with credentials taken out of its message and its exception
    text (:func:`redact_text`); installed on the ``taskfit`` logger when ``taskfit`` is imported."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact_text(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = redact_text(logging.Formatter().formatException(record.exc_info))
        return True


def install_log_filter(name: str = "taskfit") -> None:
    """Add :class:`RedactingFilter` to logger ``name`` once (idempotent)."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, RedactingFilter) for f in logger.filters):
        logger.addFilter(RedactingFilter())
