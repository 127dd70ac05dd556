"""Configuration with the keys users already write (confluent-kafka's and the Java client's), validated once at
construction: a client's connection settings (:class:`ClientConfig`) and a producer's (:class:`ProducerConfig`).
docs/configuration.md lists every key."""

from __future__ import annotations

from kafka2pc.config.client import ClientConfig
from kafka2pc.config.producer import ProducerConfig
from kafka2pc.config.redaction import Secret

__all__ = ["ClientConfig", "ProducerConfig", "Secret"]
