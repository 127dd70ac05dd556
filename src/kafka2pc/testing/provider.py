"""Choose how to provide Kafka: an existing cluster, a container, or local JVM brokers (in that order)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from kafka2pc.testing.cluster import KafkaService
from kafka2pc.testing.settings import BrokerSettings

ENV_BOOTSTRAP = "KAFKA2PC_BOOTSTRAP"
#: Force one backend: "external", "testcontainers" or "local".
ENV_BACKEND = "KAFKA2PC_BACKEND"


def choose_backend(*, nodes: int = 1) -> str:
    """The backend the harness uses: ``KAFKA2PC_BACKEND`` if set, else ``external`` when ``KAFKA2PC_BOOTSTRAP`` is
    set, else ``testcontainers`` when a Docker engine answers (single node only), else ``local``."""
    forced = os.environ.get(ENV_BACKEND)
    if forced:
        if forced not in ("external", "testcontainers", "local"):
            raise ValueError(f"{ENV_BACKEND}={forced!r}: expected external, testcontainers or local")
        return forced
    if os.environ.get(ENV_BOOTSTRAP):
        return "external"
    if nodes == 1:
        from kafka2pc.testing.containers import docker_engine_answers  # noqa: PLC0415

        if docker_engine_answers():
            return "testcontainers"
    return "local"


def start_kafka(settings: BrokerSettings | None = None, *, nodes: int = 1, backend: str | None = None) -> KafkaService:
    """Provide a ready Kafka of ``nodes`` nodes with ``settings`` from the chosen backend."""
    settings = settings or BrokerSettings()
    backend = backend or choose_backend(nodes=nodes)
    if backend == "external":
        from kafka2pc.testing.external import ExternalKafka  # noqa: PLC0415

        external = ExternalKafka(os.environ[ENV_BOOTSTRAP], settings)
        external.wait_ready()
        return external
    if backend == "testcontainers":
        from kafka2pc.testing.containers import ContainerKafka  # noqa: PLC0415

        if nodes != 1:
            raise ValueError("the testcontainers backend provides single-node Kafka only")
        return ContainerKafka(settings).start()
    from kafka2pc.testing.local import LocalKafkaCluster  # noqa: PLC0415

    return LocalKafkaCluster(settings, nodes=nodes).start()


@contextmanager
def bootstrap_or_local(bootstrap: str | None, settings: BrokerSettings | None = None) -> Iterator[str]:
    """Yield ``bootstrap`` when given; otherwise start a Kafka (:func:`start_kafka`), yield its bootstrap servers,
    and stop it afterwards. For scripts with a ``--bootstrap`` option (benchmarks, examples)."""
    if bootstrap is not None:
        yield bootstrap
        return
    service = start_kafka(settings)
    try:
        yield service.bootstrap_servers
    finally:
        service.close()
