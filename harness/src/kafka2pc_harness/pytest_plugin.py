"""pytest fixtures of kafka2pc's own test harness: the servers and clusters its tests need besides Kafka. Enable them
in the root ``conftest.py`` (so session-scoped ones are shared by every module), after kafka2pc's Kafka fixtures::

    pytest_plugins = ["kafka2pc.testing.pytest_plugin", "kafka2pc_harness.pytest_plugin"]

Fixtures:
    ``secured_kafka`` (session): a broker with SASL_SSL (PLAIN, SCRAM), mTLS and OAUTHBEARER (a local OIDC server)
    listeners, certificates made at start (:class:`kafka2pc_harness.secured.SecuredKafka`; local backend).
    ``postgres_dsn`` (session): a libpq connection string of a real PostgreSQL server (started from Debian's
    binaries, or ``KAFKA2PC_POSTGRES_DSN``).
    ``mariadb_url`` (session): ``mysql://root@127.0.0.1:PORT/kafka2pc`` of a real MariaDB server (Debian's
    binaries, or ``KAFKA2PC_MARIADB_URL``); :func:`kafka2pc_harness.mariadb.connect` opens PyMySQL connections.
    ``s3_server`` (session): moto's S3-API server with a bucket; its endpoint and keys set in the environment.
    ``gcs_server``, ``azure_storage`` (session): fake-gcs-server and Azurite, their variables set in the environment.
    ``hdfs`` (module): Hadoop's mini HDFS cluster; ``HADOOP_CONF_DIR`` set in the environment meanwhile.
    ``spark_local`` (module): a ``local[2]`` SparkSession with Spark's Kafka connector on its classpath.
    ``spark_standalone`` (session): a :class:`~kafka2pc_harness.spark_cluster.StandaloneSparkCluster`, Master and 2
    Workers of 1 core, shared by every module that uses it (each job is its own application on it). Its driver runs
    in another process (:func:`~kafka2pc_harness.spark.run_driver`) when the module also uses ``spark_local``:
    pyspark allows one SparkContext per process.

The Spark fixtures skip when pyspark is not installed; a session with a failed test keeps the Spark cluster's logs
and names them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from kafka2pc.testing import HarnessSetupError, choose_backend
from kafka2pc.testing.pytest_plugin import logs_wanted

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from kafka2pc_harness.secured import SecuredKafka
    from kafka2pc_harness.spark_cluster import StandaloneSparkCluster


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """A real PostgreSQL server for the session."""
    from kafka2pc_harness.postgres import postgres_dsn as provide  # noqa: PLC0415 - only tests that need one

    yield from _provided(provide, "PostgreSQL")


@pytest.fixture(scope="session")
def mariadb_url() -> Iterator[str]:
    """A real MariaDB server for the session."""
    from kafka2pc_harness.mariadb import mariadb_url as provide  # noqa: PLC0415 - only tests that need one

    yield from _provided(provide, "MariaDB")


def _provided(provide: Callable[[], Any], what: str) -> Iterator[str]:
    """What a harness context manager provides, for a fixture's life; a setup failure fails the test, named."""
    try:
        context = provide()
        address = context.__enter__()
    except HarnessSetupError as exc:
        pytest.fail(f"could not provide {what}: {exc}", pytrace=False)
    yield address
    context.__exit__(None, None, None)


def _serve(start: Callable[[], Any], what: str) -> Iterator[Any]:
    """Start a storage service, set its variables in this process's environment for the fixture's life (Spark drivers
    and their Python workers started by tests inherit them), stop it afterwards."""
    from kafka2pc_harness.services import environment_set  # noqa: PLC0415

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
    from kafka2pc_harness.s3 import S3Server  # noqa: PLC0415

    yield from _serve(lambda: S3Server().start(), "an S3 server")


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[Any]:
    """fake-gcs-server (a Google Cloud Storage emulator), for the session."""
    from kafka2pc_harness.object_stores import FakeGcsServer  # noqa: PLC0415

    yield from _serve(lambda: FakeGcsServer().start(), "fake-gcs-server")


@pytest.fixture(scope="session")
def azure_storage() -> Iterator[Any]:
    """Azurite (an Azure storage emulator), for the session."""
    from kafka2pc_harness.object_stores import Azurite  # noqa: PLC0415

    yield from _serve(lambda: Azurite().start(), "Azurite")


@pytest.fixture(scope="module")
def hdfs() -> Iterator[Any]:
    """Hadoop's mini HDFS cluster on loopback, ``HADOOP_CONF_DIR`` pointing at its configuration, for the test module
    (other modules' scheme-less paths stay local)."""
    from kafka2pc_harness.hdfs import MiniHdfs  # noqa: PLC0415

    yield from _serve(lambda: MiniHdfs().start(), "HDFS")


@pytest.fixture(scope="session")
def secured_kafka(request: pytest.FixtureRequest) -> Iterator[SecuredKafka]:
    """A broker with the listeners of managed Kafka: SASL_SSL (PLAIN, SCRAM-SHA-256/512), mTLS, OAUTHBEARER against a
    local OIDC server, and one whose certificate names another host."""
    from kafka2pc_harness.secured import SecuredKafka  # noqa: PLC0415

    if choose_backend() == "external":
        pytest.skip("the secured listeners need the local JVM backend; KAFKA2PC_BOOTSTRAP is fixed")
    try:
        secured = SecuredKafka().start()
    except HarnessSetupError as exc:
        pytest.fail(f"could not provide the secured Kafka: {exc}", pytrace=False)
    yield secured
    secured.close(keep_logs=logs_wanted(request, secured))


def _require_pyspark() -> None:
    pytest.importorskip("pyspark", reason="pyspark is not installed: pip install 'kafka2pc[spark]'")


@pytest.fixture(scope="module")
def spark_local(request: pytest.FixtureRequest) -> Iterator[SparkSession]:
    """A ``local[2]`` SparkSession with Spark's Kafka connector, shared by the test module."""
    _require_pyspark()
    from kafka2pc_harness.spark import local_session, stop_session  # noqa: PLC0415 - pyspark checked above

    try:
        session = local_session(f"kafka2pc-{request.module.__name__}", cores=2, kafka_connector=True)
    except HarnessSetupError as exc:
        pytest.fail(f"could not start a local SparkSession: {exc}", pytrace=False)
    yield session
    stop_session(session)


@pytest.fixture(scope="session")
def spark_standalone(request: pytest.FixtureRequest) -> Iterator[StandaloneSparkCluster]:
    """A Spark standalone cluster on loopback (Master, 2 Workers of 1 core), shared by the test session."""
    _require_pyspark()
    from kafka2pc_harness.spark_cluster import StandaloneSparkCluster  # noqa: PLC0415

    failed_before = request.session.testsfailed
    try:
        cluster = StandaloneSparkCluster(workers=2, cores_per_worker=1).start()
    except HarnessSetupError as exc:
        pytest.fail(f"could not start a Spark standalone cluster: {exc}", pytrace=False)
    yield cluster
    failed = request.session.testsfailed > failed_before
    cluster.close(keep_logs=failed)
    if failed:
        print(f"\nSpark standalone cluster logs kept in {cluster.workdir}")
