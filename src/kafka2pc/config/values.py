"""Parsers of configuration values: each takes the key (for its error) and the value as given, string or typed."""

from __future__ import annotations

from collections.abc import Callable

from kafka2pc.errors import ConfigError

_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")


def servers(key: str, value: object) -> str:
    """``host:port[,host:port...]`` (a list of them is joined)."""
    text = value if isinstance(value, str) else ",".join(value) if isinstance(value, list | tuple) else None
    if not text:
        raise ConfigError(key, "expected a non-empty 'host:port[,host:port...]' string")
    for server in text.split(","):
        host, sep, port = server.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(key, f"{server.strip()!r} is not host:port")
    return ",".join(server.strip() for server in text.split(","))


def text(key: str, value: object) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value:
        raise ConfigError(key, "expected a non-empty string")
    return value


def secret_text(key: str, value: object) -> object:
    """A non-empty secret string (a :class:`~kafka2pc.config.Secret`); the error never shows it."""
    revealed = value.reveal() if hasattr(value, "reveal") else value
    if not isinstance(revealed, str) or not revealed:
        raise ConfigError(key, "expected a non-empty string")
    return value


def boolean(key: str, value: object) -> bool:
    """true/false, 1/0, yes/no, or a bool."""
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ConfigError(key, f"expected true or false, got {value!r}")


def integer(key: str, value: object, *, minimum: int) -> int:
    """An integer (or its decimal string) of at least ``minimum``."""
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
        number = int(value)
    if number is None or number < minimum:
        raise ConfigError(key, f"expected an integer >= {minimum}, got {value!r}")
    return number


def positive(key: str, value: object) -> int:
    """An integer above zero."""
    return integer(key, value, minimum=1)


def non_negative(key: str, value: object) -> int:
    """An integer of zero or more."""
    return integer(key, value, minimum=0)


def one_of(*choices: str, upper: bool = True) -> Callable[[str, object], str]:
    """One of ``choices``, compared in upper (or lower) case."""

    def parse(key: str, value: object) -> str:
        word = str(value).strip()
        word = word.upper() if upper else word.lower()
        if word not in choices:
            raise ConfigError(key, f"expected one of {', '.join(choices)}, got {value!r}")
        return word

    return parse


def fraction(low: float, high: float) -> Callable[[str, object], float]:
    """A number between ``low`` and ``high``."""

    def parse(key: str, value: object) -> float:
        try:
            number = float(str(value))
        except ValueError:
            number = float("nan")
        if not low <= number <= high:
            raise ConfigError(key, f"expected a number from {low:g} to {high:g}, got {value!r}")
        return number

    return parse
