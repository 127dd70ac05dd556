"""kafka2pc: Apache Kafka as a correct two-phase-commit participant (KIP-939)."""

from __future__ import annotations

from kafka2pc.capabilities import BrokerCapabilities, probe_capabilities
from kafka2pc.config import ClientConfig
from kafka2pc.errors import (
    BrokerUnavailableError,
    ConfigError,
    Kafka2pcError,
    KafkaProtocolError,
    UnsupportedByBrokerError,
)

__version__ = "0.1.0.dev0"

__all__ = [
    "BrokerCapabilities",
    "BrokerUnavailableError",
    "ClientConfig",
    "ConfigError",
    "Kafka2pcError",
    "KafkaProtocolError",
    "UnsupportedByBrokerError",
    "__version__",
    "probe_capabilities",
]
