"""pytest fixtures that provide real Kafka brokers.

Enable in a ``conftest.py`` with ``pytest_plugins = ["kafka2pc.testing.pytest_plugin"]``.

Fixtures:
    ``kafka`` (session): single node, newest release, 2PC on.
    ``kafka_pre2pc`` (session): single node, Apache Kafka 3.9.x (no KIP-939).
    ``kafka_3node`` (session): 3-node KRaft cluster, transaction log replicated 3x with min ISR 2 (local backend).
    ``kafka_factory`` (function): ``kafka_factory(BrokerSettings(...), nodes=1)`` starts a dedicated cluster for one
    test and stops it afterwards.
    ``secured_kafka`` (session): a broker with SASL_SSL (PLAIN, SCRAM), mTLS and OAUTHBEARER (a local OIDC server)
    listeners, certificates made at start (:class:`kafka2pc.testing.secured.SecuredKafka`; local backend).
    ``topic_factory`` (function): ``topic_factory(kafka, partitions=1)`` creates a fresh topic.
    ``postgres_dsn`` (session): a libpq connection string of a real PostgreSQL server (started from Debian's
    binaries, or ``KAFKA2PC_POSTGRES_DSN``).
    ``s3_server`` (session): moto's S3-API server with a bucket; its endpoint and keys set in the environment.
    ``gcs_server``, ``azure_storage`` (session): fake-gcs-server and Azurite, their variables set in the environment.
    ``hdfs`` (module): Hadoop's mini HDFS cluster; ``HADOOP_CONF_DIR`` set in the environment meanwhile.

A failed test keeps the logs of every cluster it used and names their location in its report.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from typing import Any

import pytest

from kafka2pc.testing.cluster import KafkaService
from kafka2pc.testing.errors import HarnessSetupError
from kafka2pc.testing.jars import PRE_2PC_KAFKA_VERSION
from kafka2pc.testing.provider import choose_backend, start_kafka
from kafka2pc.testing.settings import BrokerSettings

_FAILED_WITH = pytest.StashKey[set[int]]()


def _start_or_fail(settings: BrokerSettings, nodes: int = 1, backend: str | None = None) -> KafkaService:
    try:
        return start_kafka(settings, nodes=nodes, backend=backend)
    except HarnessSetupError as exc:
        pytest.fail(f"could not provide Kafka: {exc}", pytrace=False)


def _close(request: pytest.FixtureRequest, service: KafkaService) -> None:
    failed = request.session.stash.get(_FAILED_WITH, set())
    service.close(keep_logs=id(service) in failed)


def _skip_unless_local(what: str) -> None:
    backend = choose_backend(nodes=3)
    if backend != "local":
        pytest.skip(f"{what} needs the local JVM backend (selected: {backend})")


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """A real PostgreSQL server for the session."""
    from kafka2pc.testing.postgres import postgres_dsn as provide  # noqa: PLC0415 - only tests that need one

    try:
        context = provide()
        dsn = context.__enter__()
    except HarnessSetupError as exc:
        pytest.fail(f"could not provide PostgreSQL: {exc}", pytrace=False)
    yield dsn
    context.__exit__(None, None, None)


def _serve(start: Callable[[], Any], what: str) -> Iterator[Any]:
    """Start a storage service, set its variables in this process's environment for the fixture's life (Spark drivers
    and their Python workers started by tests inherit them), stop it afterwards."""
    from kafka2pc.testing.services import environment_set  # noqa: PLC0415

    try:
        service = start()
    except HarnessSetupError as exc:
        pytest.fail(f"could not start {what}: {exc}", pytrace=False)
    try:
        with environment_set(service.environment()):
            yield service
    finally:
        service.close()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[Any]:
    """An S3-API server (moto's) with a bucket, for the session."""
    from kafka2pc.testing.s3 import S3Server  # noqa: PLC0415

    yield from _serve(lambda: S3Server().start(), "an S3 server")


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[Any]:
    """fake-gcs-server (a Google Cloud Storage emulator), for the session."""
    from kafka2pc.testing.object_stores import FakeGcsServer  # noqa: PLC0415

    yield from _serve(lambda: FakeGcsServer().start(), "fake-gcs-server")


@pytest.fixture(scope="session")
def azure_storage() -> Iterator[Any]:
    """Azurite (an Azure storage emulator), for the session."""
    from kafka2pc.testing.object_stores import Azurite  # noqa: PLC0415

    yield from _serve(lambda: Azurite().start(), "Azurite")


@pytest.fixture(scope="module")
def hdfs() -> Iterator[Any]:
    """Hadoop's mini HDFS cluster on loopback, ``HADOOP_CONF_DIR`` pointing at its configuration, for the test module
    (other modules' scheme-less paths stay local)."""
    from kafka2pc.testing.hdfs import MiniHdfs  # noqa: PLC0415

    yield from _serve(lambda: MiniHdfs().start(), "HDFS")


@pytest.fixture(scope="session")
def kafka(request: pytest.FixtureRequest) -> Iterator[KafkaService]:
    """Single-node Kafka, newest release, 2PC enabled."""
    service = _start_or_fail(BrokerSettings())
    yield service
    _close(request, service)


@pytest.fixture(scope="session")
def kafka_pre2pc(request: pytest.FixtureRequest) -> Iterator[KafkaService]:
    """Single-node Apache Kafka 3.9.x, which has no KIP-939 support."""
    if choose_backend() == "external":
        pytest.skip("an external cluster (KAFKA2PC_BOOTSTRAP) has one fixed version")
    service = _start_or_fail(BrokerSettings(version=PRE_2PC_KAFKA_VERSION))
    yield service
    _close(request, service)


@pytest.fixture(scope="session")
def kafka_3node(request: pytest.FixtureRequest) -> Iterator[KafkaService]:
    """A 3-node KRaft cluster of the newest release, 2PC enabled, with single-node control."""
    _skip_unless_local("the 3-node cluster")
    service = _start_or_fail(BrokerSettings(), nodes=3, backend="local")
    yield service
    _close(request, service)


@pytest.fixture(scope="session")
def secured_kafka(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A broker with the listeners of managed Kafka: SASL_SSL (PLAIN, SCRAM-SHA-256/512), mTLS, OAUTHBEARER against a
    local OIDC server, and one whose certificate names another host."""
    from kafka2pc.testing.secured import SecuredKafka  # noqa: PLC0415

    if choose_backend() == "external":
        pytest.skip("the secured listeners need the local JVM backend; KAFKA2PC_BOOTSTRAP is fixed")
    try:
        secured = SecuredKafka().start()
    except HarnessSetupError as exc:
        pytest.fail(f"could not provide the secured Kafka: {exc}", pytrace=False)
    yield secured
    failed = request.session.stash.get(_FAILED_WITH, set())
    secured.close(keep_logs=id(secured.service) in failed)


@pytest.fixture
def kafka_factory(request: pytest.FixtureRequest) -> Iterator[Callable[..., KafkaService]]:
    """Start dedicated clusters for one test: ``kafka_factory(settings, nodes=1)``."""
    started: list[KafkaService] = []

    def make(settings: BrokerSettings | None = None, *, nodes: int = 1) -> KafkaService:
        if choose_backend(nodes=nodes) == "external":
            pytest.skip("this test needs brokers with particular settings; KAFKA2PC_BOOTSTRAP is fixed")
        service = _start_or_fail(settings or BrokerSettings(), nodes=nodes)
        started.append(service)
        request.node.stash.setdefault(_USED, []).append(service)
        return service

    yield make
    for service in started:
        _close(request, service)


@pytest.fixture
def topic_factory() -> Callable[..., str]:
    """Create a fresh topic: ``topic_factory(kafka, partitions=1, **kwargs)``."""
    from kafka2pc.testing.verify import create_topic  # noqa: PLC0415 - needs the testing extra

    def make(service: KafkaService, partitions: int = 1, **kwargs: Any) -> str:
        return create_topic(service.client_config, partitions=partitions, **kwargs)

    return make


_USED = pytest.StashKey[list[KafkaService]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """On failure, keep the logs of every cluster the test used and say where they are."""
    report = yield
    if not report.failed:
        return report
    used: list[KafkaService] = item.stash.get(_USED, [])
    given = [getattr(v, "service", v) for v in getattr(item, "funcargs", {}).values()]
    services = [v for v in given if isinstance(v, KafkaService)] + used
    if not services:
        return report
    failed = item.session.stash.setdefault(_FAILED_WITH, set())
    lines = []
    for service in services:
        failed.add(id(service))
        lines.append(f"{service.backend} Kafka {service.settings.version} at {service.bootstrap_servers}: "
                     f"logs kept in {service.logs_location}")
    report.sections.append(("kafka2pc broker logs", "\n".join(lines)))
    return report
