"""pytest fixtures for Spark tests. Enable them in the root ``conftest.py`` (so a session-scoped cluster is shared by
every module)::

    pytest_plugins = ["kafka2pc.testing.pytest_plugin", "kafka2pc.testing.spark_fixtures"]

``spark_local`` (module): a ``local[2]`` SparkSession with Spark's Kafka connector on its classpath.
``spark_standalone`` (session): a :class:`~kafka2pc.testing.spark_cluster.StandaloneSparkCluster`, Master and 2
Workers of 1 core, shared by every module that uses it (each job is its own application on it). Its driver runs in
another process (:func:`~kafka2pc.testing.spark.run_driver`) when the module also uses ``spark_local``: pyspark
allows one SparkContext per process.

Both skip when pyspark is not installed; a session with a failed test keeps the cluster's logs and names them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from kafka2pc.testing.errors import HarnessSetupError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from kafka2pc.testing.spark_cluster import StandaloneSparkCluster


def _require_pyspark() -> None:
    pytest.importorskip("pyspark", reason="pyspark is not installed: pip install 'kafka2pc[spark]'")


@pytest.fixture(scope="module")
def spark_local(request: pytest.FixtureRequest) -> Iterator[SparkSession]:
    """A ``local[2]`` SparkSession with Spark's Kafka connector, shared by the test module."""
    _require_pyspark()
    from kafka2pc.testing.spark import local_session, stop_session  # noqa: PLC0415 - pyspark checked above

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
    from kafka2pc.testing.spark_cluster import StandaloneSparkCluster  # noqa: PLC0415

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
