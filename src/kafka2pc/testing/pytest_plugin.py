"""pytest fixtures that provide real Kafka brokers.

Enable in a ``conftest.py`` with ``pytest_plugins = ["kafka2pc.testing.pytest_plugin"]``.

Fixtures:
    ``kafka`` (session): single node, newest release, 2PC on.
    ``kafka_pre2pc`` (session): single node, Apache Kafka 3.9.x (no KIP-939).
    ``kafka_3node`` (session): 3-node KRaft cluster, transaction log replicated 3x with min ISR 2 (local backend).
    ``kafka_factory`` (function): ``kafka_factory(BrokerSettings(...), nodes=1)`` starts a dedicated cluster for one
    test and stops it afterwards.
    ``topic_factory`` (function): ``topic_factory(kafka, partitions=1)`` creates a fresh topic.

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

#: the fixtures (``logs_wanted`` is for kafka2pc's own harness)
__all__ = ["kafka", "kafka_3node", "kafka_factory", "kafka_pre2pc", "topic_factory"]

_FAILED_WITH = pytest.StashKey[set[int]]()


def _start_or_fail(settings: BrokerSettings, nodes: int = 1, backend: str | None = None) -> KafkaService:
    try:
        return start_kafka(settings, nodes=nodes, backend=backend)
    except HarnessSetupError as exc:
        pytest.fail(f"could not provide Kafka: {exc}", pytrace=False)


def logs_wanted(request: pytest.FixtureRequest, service: object) -> bool:
    """Whether a failed test of this session used ``service`` (a :class:`KafkaService`, or an object whose
    ``service`` attribute is one), so a fixture closing it should keep its logs."""
    return id(getattr(service, "service", service)) in request.session.stash.get(_FAILED_WITH, set())


def _close(request: pytest.FixtureRequest, service: KafkaService) -> None:
    service.close(keep_logs=logs_wanted(request, service))


def _skip_unless_local(what: str) -> None:
    backend = choose_backend(nodes=3)
    if backend != "local":
        pytest.skip(f"{what} needs the local JVM backend (selected: {backend})")


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
