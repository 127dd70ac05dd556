"""A real-Apache-Kafka test harness for kafka2pc's tests and for yours.

``start_kafka(BrokerSettings(...), nodes=1)`` provides a ready cluster: an existing one named by
``KAFKA2PC_BOOTSTRAP``, else a testcontainers Kafka when a Docker engine answers, else Apache Kafka's Maven Central
jars run with the machine's ``java`` (KRaft, loopback ports). pytest fixtures are in
:mod:`kafka2pc.testing.pytest_plugin`; read_committed verification helpers in :mod:`kafka2pc.testing.verify`.

Importing it loads none of pytest, confluent-kafka, testcontainers or pyspark: those are imported by the modules and
functions that use them. The servers kafka2pc's own suite starts besides Kafka (PostgreSQL, HDFS, object stores,
Spark clusters, fault proxies) are in kafka2pc_harness, built from the repository's ``harness/``, not in this wheel.
"""

from __future__ import annotations

from kafka2pc.testing.cluster import KafkaService
from kafka2pc.testing.errors import HarnessSetupError, NodeControlUnsupported
from kafka2pc.testing.jars import NEWEST_KAFKA_VERSION, PRE_2PC_KAFKA_VERSION
from kafka2pc.testing.local import LocalKafkaCluster
from kafka2pc.testing.provider import choose_backend, start_kafka
from kafka2pc.testing.settings import BrokerSettings

__all__ = [
    "NEWEST_KAFKA_VERSION",
    "PRE_2PC_KAFKA_VERSION",
    "BrokerSettings",
    "HarnessSetupError",
    "KafkaService",
    "LocalKafkaCluster",
    "NodeControlUnsupported",
    "choose_backend",
    "start_kafka",
]
