"""The exceptions kafka2pc raises: one hierarchy under :class:`Kafka2pcError`."""

from __future__ import annotations


class Kafka2pcError(Exception):
    """Base class of every error kafka2pc raises on purpose."""


class ConfigError(Kafka2pcError, ValueError):
    """A configuration key is unknown, malformed or contradicts another; the message names the key."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"config {key!r}: {problem}")
        self.key = key


class BrokerUnavailableError(Kafka2pcError):
    """No broker of the cluster could be reached, or a needed one did not answer in time."""


class KafkaProtocolError(Kafka2pcError):
    """A broker answered a request with an error code that kafka2pc does not turn into something more specific."""

    def __init__(self, api: str, error_name: str, error_code: int, detail: str = "") -> None:
        message = f"{api} failed: {error_name} (error code {error_code})"
        super().__init__(f"{message}: {detail}" if detail else message)
        self.api = api
        self.error_name = error_name
        self.error_code = error_code


class UnsupportedByBrokerError(Kafka2pcError):
    """The broker does not support a protocol version or feature that the operation needs."""
