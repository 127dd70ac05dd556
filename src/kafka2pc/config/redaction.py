"""Secrets (passwords, tokens, client secrets, key passphrases) kept out of logs, messages and reprs.

A :class:`Secret` hides its value from ``repr`` and ``str``; :meth:`Secret.reveal` hands it to the code that must
send it. Every secret is also remembered, and from the first one on, each log record this process creates has any
remembered value replaced by ``***`` before a handler sees it, whichever library logged it: kafka-python, for one,
logs its whole configuration and its SASL requests at DEBUG.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

#: values shorter than this are not searched for (they would blank out ordinary words)
_SHORTEST = 4
_MASK = "***"
_known: set[str] = set()
_lock = threading.Lock()
_installed: list[bool] = []  # one element once the record factory is wrapped


class Secret:
    """A secret string: ``repr`` and ``str`` show ``***``; :meth:`reveal` gives the value. Equal by value, so
    configurations holding one still compare and hash."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value
        remember(value)

    def reveal(self) -> str:
        """The value itself, for the code that sends it."""
        return self._value

    def __repr__(self) -> str:
        return f"Secret('{_MASK}')"

    def __str__(self) -> str:
        return _MASK

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash((Secret, self._value))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Secret, (self._value,))


def reveal(value: object) -> Any:
    """``value`` itself, or the value of a :class:`Secret`."""
    return value.reveal() if isinstance(value, Secret) else value


def remember(value: str) -> None:
    """Keep ``value`` out of every log record from now on (tokens are remembered as they are fetched)."""
    if len(value) < _SHORTEST:
        return
    variants = {value, repr(value.encode())[2:-1], repr(value)[1:-1]}
    with _lock:
        _known.update(variants)
    _install()


def redact(text: str) -> str:
    """``text`` with every remembered secret replaced by ``***``."""
    if not _known:
        return text
    for value in sorted(_known, key=len, reverse=True):
        if value in text:
            text = text.replace(value, _MASK)
    return text


def _install() -> None:
    """Wrap the process's log record factory once: records are created only for enabled levels, so this costs
    nothing for suppressed DEBUG lines."""
    with _lock:
        if _installed:
            return
        _installed.append(True)
        previous = logging.getLogRecordFactory()

    def make_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        _scrub(record)
        return record

    logging.setLogRecordFactory(make_record)


def _scrub(record: logging.LogRecord) -> None:
    try:
        message = record.getMessage()
    except Exception:  # a malformed record: leave it to logging's own error report
        return
    clean = redact(message)
    if clean != message:
        record.msg, record.args = clean, None
    if record.exc_info and record.exc_info[1] is not None:
        formatted = logging.Formatter().formatException(record.exc_info)
        clean = redact(formatted)
        if clean != formatted:
            record.exc_text = clean
