"""The kafka2pc data source over Spark Connect (``SparkSession.builder.remote(...)``), the way Databricks serverless
and shared clusters run PySpark: a Connect server in its own process (pyspark's own jars, ``local[2]``) and the
test's clients on loopback. kafka2pc runs on the server: the client only sends ``format("kafka2pc")`` and options.

Where kafka2pc must be installed, pinned here: a client without it writes; a server whose Python lacks it answers
``DATA_SOURCE_NOT_FOUND``, and a client-side ``spark.dataSource.register`` does not ship it (docs/spark.md, "Spark
Connect").
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark")  # the Connect client's own packages come with it (dev: pyspark[connect])

from kafka2pc_harness.spark import LOG4J2 as SPARK_LOG4J2  # noqa: E402

from .spark_support import audit, open_transactions, sink_prefix  # noqa: E402

pytestmark = pytest.mark.integration
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
STARTED = re.compile(r"Spark Connect server started at: 127\.0\.0\.1:(\d+)")
LOG4J2 = SPARK_LOG4J2 + """\
logger.started.name = org.apache.spark.sql.connect.service.SparkConnectServer
logger.started.level = info
"""
#: Makes ``kafka2pc`` (and the ``pyspark_kafka2pc`` module that registers its format) not importable, as in a
#: Python where it is not installed; a client script starts with it, a server's Python gets it as sitecustomize.
WITHOUT_KAFKA2PC = """\
import importlib.abc, sys
class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("kafka2pc", "pyspark_kafka2pc"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _NotInstalled())
"""


def _die_with_test_process() -> None:
    """The server is killed when the test process dies (PR_SET_PDEATHSIG), so a crashed run leaves no JVM."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


@contextlib.contextmanager
def connect_server(workdir: Path, python: str) -> Iterator[str]:
    """A Spark Connect server (``local[2]``) whose Python data sources run ``python``; yields its ``sc://`` URL.

    Spark looks the installed ``pyspark_*`` data sources up with the Python that the server's environment names
    (``PYSPARK_DRIVER_PYTHON``, else ``PYSPARK_PYTHON``, else ``python3`` on its PATH), not ``spark.pyspark.python``.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "log4j2.properties").write_text(LOG4J2)
    home = Path(pyspark.__file__).parent
    conf = {
        "spark.master": "local[2]",
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": "0",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.local.dir": str(workdir / "local"),
        "spark.sql.warehouse.dir": str(workdir / "warehouse"),
        # C1 only and the serial collector: the server starts in about two thirds of the time (measured, 2 cores)
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC "
                                         f"-Dlog4j2.configurationFile=file:{workdir / 'log4j2.properties'}",
    }
    command = [str(home / "bin" / "spark-submit"), "--class", SERVER_CLASS]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python}
    log = workdir / "server.log"
    with log.open("wb") as out:
        server = subprocess.Popen(command, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, start_new_session=True,
                                  preexec_fn=_die_with_test_process)  # noqa: PLW1509 - prctl only
    try:
        deadline = time.monotonic() + 120
        while not (started := STARTED.search(log.read_text(errors="replace"))):
            if server.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-3000:]
                pytest.fail(f"the Spark Connect server did not start (exit {server.poll()}):\n{tail}", pytrace=False)
            time.sleep(0.2)
        yield f"sc://127.0.0.1:{started[1]}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)  # the server and the Python workers it started: its own group
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)


@pytest.fixture(scope="module")
def server_url(tmp_path_factory) -> Iterator[str]:
    """One Connect server for the module, its Python this interpreter (which has kafka2pc)."""
    with connect_server(tmp_path_factory.mktemp("connect-server"), sys.executable) as url:
        yield url


@pytest.fixture(scope="module", autouse=True)
def _classic_spark_afterwards() -> Iterator[None]:
    """pyspark marks a process that made a Connect session as a Connect client and keeps the mark after stop(): a
    later module's classic session in this process would fail (measured: ``[CONNECT_URL_NOT_SET]`` in
    test_spark_sink.py's fixture, pyspark making a Connect session instead)."""
    was_set = "SPARK_CONNECT_MODE_ENABLED" in os.environ
    yield
    if not was_set:
        os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)


@pytest.fixture(scope="module")
def remote(server_url):
    """A Spark Connect session of this process on the module's server."""
    from pyspark.sql import SparkSession  # noqa: PLC0415

    session = SparkSession.builder.remote(server_url).getOrCreate()
    yield session
    session.stop()


def run_client(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``script`` in a client process of its own, where kafka2pc is not importable; ``args``: its argv."""
    return subprocess.run([sys.executable, "-c", WITHOUT_KAFKA2PC + textwrap.dedent(script), *args],
                          capture_output=True, text=True, timeout=180, check=False)


def without_jvm_frames(output: str) -> str:
    """A client's error output without the server's JVM stack frames (its error class and message stay)."""
    return "\n".join(line for line in output.splitlines() if not line.lstrip().startswith("at "))[-3000:]


BATCH_CLIENT = """
import sys
from pyspark.sql import SparkSession
try:
    import kafka2pc
except ModuleNotFoundError:
    pass
else:
    sys.exit("kafka2pc is importable in this client")
url, bootstrap, topic, checkpoint, rows = sys.argv[1:]
spark = SparkSession.builder.remote(url).getOrCreate()
(spark.range(0, int(rows), numPartitions=3)
    .selectExpr("CAST(id AS STRING) AS key", "to_json(named_struct('id', id)) AS value")
    .write.format("kafka2pc").option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
    .option("checkpointLocation", checkpoint).mode("append").save())
spark.stop()
"""


def test_a_batch_write_from_a_client_without_kafka2pc(server_url, kafka, topic_factory, tmp_path):
    """The client needs pyspark's Connect client only: kafka2pc runs on the server."""
    topic = topic_factory(kafka, partitions=2)
    checkpoint = tmp_path / "ck"
    client = run_client(BATCH_CLIENT, server_url, kafka.bootstrap_servers, topic, str(checkpoint), "500")
    assert client.returncode == 0, without_jvm_frames(client.stderr)
    report = audit(kafka.bootstrap_servers, topic, 500)
    assert (report["records"], report["duplicates"], report["gaps"], report["clean"]) == (500, 0, 0, True)
    assert open_transactions(kafka.bootstrap_servers, sink_prefix(checkpoint)) == []


def test_a_streaming_write_over_spark_connect(remote, kafka, topic_factory, tmp_path):
    """A file source -> kafka2pc query over Connect, three micro-batches (one file each) to the end of its input."""
    topic = topic_factory(kafka, partitions=3)
    source, checkpoint = tmp_path / "in", tmp_path / "ck"
    source.mkdir()
    for number in range(3):  # one file a micro-batch, 100 rows each
        rows = (json.dumps({"id": i}) for i in range(number * 100, number * 100 + 100))
        (source / f"part-{number}.json").write_text("\n".join(rows) + "\n")
    df = (remote.readStream.schema("id LONG").option("maxFilesPerTrigger", 1).json(str(source)).repartition(2)
          .selectExpr("CAST(id AS STRING) AS key", "to_json(named_struct('id', id)) AS value"))
    query = (df.writeStream.format("kafka2pc").option("kafka.bootstrap.servers", kafka.bootstrap_servers)
             .option("topic", topic).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(120), "the query did not finish its input in 120 s"
        assert query.exception() is None, query.exception()
        batches = [(p.batchId, p.numInputRows) for p in query.recentProgress]
    finally:
        query.stop()
    assert [rows for _, rows in batches if rows] == [100, 100, 100], batches
    assert sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit()) == [0, 1, 2]
    report = audit(kafka.bootstrap_servers, topic, 300)
    assert (report["records"], report["duplicates"], report["gaps"], report["lso_pinned"], report["clean"]) == \
        (300, 0, 0, [], True)
    assert open_transactions(kafka.bootstrap_servers, sink_prefix(checkpoint)) == []


def write_ten_rows(session, bootstrap: str, topic: str, checkpoint: Path) -> None:
    (session.range(10).selectExpr("to_json(named_struct('id', id)) AS value").write.format("kafka2pc")
     .option("kafka.bootstrap.servers", bootstrap).option("topic", topic).option("checkpointLocation", str(checkpoint))
     .mode("append").save())


def test_a_server_whose_python_lacks_kafka2pc_cannot_write(kafka, topic_factory, tmp_path):
    """What a user sees when kafka2pc is only on the client: DATA_SOURCE_NOT_FOUND; registering the class from the
    client gets as far as the server's Python, which cannot import it."""
    from pyspark.errors import PySparkException  # noqa: PLC0415
    from pyspark.sql import SparkSession  # noqa: PLC0415

    from kafka2pc.spark import register  # noqa: PLC0415

    hidden = tmp_path / "without-kafka2pc"
    hidden.mkdir()
    (hidden / "sitecustomize.py").write_text(WITHOUT_KAFKA2PC)
    python = tmp_path / "python-without-kafka2pc"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{hidden}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    topic = topic_factory(kafka)
    with connect_server(tmp_path / "server", str(python)) as url:
        session = SparkSession.builder.remote(url).create()  # this client has kafka2pc; the server's Python not
        try:
            with pytest.raises(PySparkException, match=r"\[DATA_SOURCE_NOT_FOUND\] Failed to find the data source: "
                                                       r"kafka2pc\."):
                write_ten_rows(session, kafka.bootstrap_servers, topic, tmp_path / "ck1")
            register(session)  # accepted: the class goes to the server cloudpickled, by reference
            with pytest.raises(PySparkException, match=r"(?s)PYTHON_DATA_SOURCE_ERROR.*No module named 'kafka2pc'"):
                write_ten_rows(session, kafka.bootstrap_servers, topic, tmp_path / "ck2")
        finally:
            session.stop()
    assert audit(kafka.bootstrap_servers, topic, 10)["records"] == 0
