"""The main job (examples/spark_job.py) with its checkpoint on HDFS or S3 while the store goes down around a commit.

Spark's own checkpoint (offsets, commits) and kafka2pc's sink state and decisions are both on the store: HDFS (the
mini cluster: Spark's Hadoop client and kafka2pc's WebHDFS) or S3 (moto: Spark through S3A, kafka2pc through
s3fs). Once a transaction is open under the sink's prefix (a batch is being written), after a random 0-2 s, the
store is stopped for a random 2-6 s (HDFS: its JVM SIGKILLed and relaunched on the same ports and data; S3: the
port and every connection closed, moto's data kept) and then serves again. The driver either goes on (a later
batch completes) or exits with a loud, retriable error; never with a lost transaction, a corrupt decision log or
missing sink state. A driver that went on is then SIGKILLed (its process group) while a transaction is open, and
run again until caught up: read_committed shows every record once, no gap, and no transaction is left open under
the prefix.

Once per store in the default suite; ``KAFKA2PC_STORAGE_OUTAGES`` outages per store in ``make chaos`` (the driver
run again after each one it did not survive). ``KAFKA2PC_OUTAGE_SEED`` replays the moments and lengths of a run."""

from __future__ import annotations

import os
import random
import re
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

import kafka2pc.errors
from kafka2pc.spark.state import SinkStore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

OUTAGES = int(os.environ.get("KAFKA2PC_STORAGE_OUTAGES", "1"))
#: enough input for every outage round and the kill after them: each round spans about two batches of 150, and
#: with a single round (the default suite) 1500 are plenty; 5 rounds once ran out of input before the kill
RECORDS = 1500 * max(1, OUTAGES)
JOB = Path(__file__).resolve().parents[2] / "examples" / "spark_job.py"
#: what a storage outage must never turn into
FORBIDDEN = re.compile(r"TransactionLostError|DecisionLogCorruptError|SinkStateMissingError|corrupt", re.IGNORECASE)
#: kafka2pc's retriable errors, by name
RETRIABLE_KAFKA2PC = sorted(name for name, value in vars(kafka2pc.errors).items()
                            if isinstance(value, type) and issubclass(value, kafka2pc.errors.RetriableError))
#: an I/O failure of Spark's own Hadoop client (its offsets and commits logs), which ends the query (Spark does not
#: retry it) and which running the query again retries: the NameNode or S3 gone mid-call
SPARK_STORE_IO = re.compile(r"java\.io\.EOFException|java\.net\.\w+Exception|Connection refused|Connection reset|"
                            r"AWSClientIOException|SdkClientException|"
                            r"apache\.http\.(ConnectionClosedException|NoHttpResponseException)")


#: both runs go with make chaos (S3A's 2-3 min, then HDFS's 110 s, took the default suite over its time budget); an
#: outage read as absent is decided in tests/unit/sink/test_storage_outages.py and test_recovery.py, the stores'
#: outages themselves by the two tests below, S3's commit point in test_remote_checkpoints.py
@pytest.fixture(params=[pytest.param("hdfs", marks=pytest.mark.slow), pytest.param("s3a", marks=pytest.mark.slow)])
def store(request: pytest.FixtureRequest) -> tuple[Any, str, dict[str, str]]:
    """(the storage server, a fresh checkpoint location on it, the driver's extra environment)."""
    folder = f"checkpoints/{uuid.uuid4().hex[:8]}"
    if request.param == "hdfs":
        hdfs = request.getfixturevalue("hdfs")
        return hdfs, f"{hdfs.url}/{folder}", {}
    s3 = request.getfixturevalue("s3_server")
    return s3, f"s3a://{s3.bucket}/{folder}", s3.spark_environment()


def refused(url: str) -> bool:
    """Whether an HTTP request to ``url`` fails with a refused connection."""
    try:
        urllib.request.urlopen(url, timeout=5).close()
    except urllib.error.URLError as exc:
        return isinstance(exc.reason, ConnectionRefusedError)
    return False


def test_an_s3_outage_refuses_connections_and_keeps_the_objects(s3_server):
    import s3fs  # noqa: PLC0415 - the s3 extra
    from botocore.exceptions import EndpointConnectionError  # noqa: PLC0415

    key = f"{s3_server.bucket}/outage-{uuid.uuid4().hex[:8]}"
    filesystem = s3fs.S3FileSystem(skip_instance_cache=True,
                                   config_kwargs={"retries": {"max_attempts": 1}})
    filesystem.pipe_file(key, b"before")
    with s3_server.outage():
        assert refused(f"{s3_server.endpoint}/{key}")
        with pytest.raises(EndpointConnectionError):  # a refused connection, as botocore names it
            filesystem.cat_file(key)
    assert filesystem.cat_file(key) == b"before"
    filesystem.pipe_file(key, b"after")
    assert filesystem.cat_file(key) == b"after" and len(s3_server.outages) >= 1


def test_an_hdfs_outage_is_a_crash_and_a_restart_with_the_data(hdfs):
    import fsspec  # noqa: PLC0415 - the hdfs extra

    webhdfs = fsspec.filesystem("webhdfs", host="127.0.0.1", port=hdfs.http_port, user="root",
                                skip_instance_cache=True, use_listings_cache=False)
    path = f"/outage/{uuid.uuid4().hex[:8]}"
    webhdfs.pipe_file(path, b"before")
    pid = hdfs.pid
    with hdfs.outage():
        assert refused(f"http://127.0.0.1:{hdfs.http_port}/webhdfs/v1{path}?op=GETFILESTATUS&user.name=root")
    assert hdfs.pid not in (None, pid) and hdfs.serving()
    assert webhdfs.cat_file(path) == b"before"
    webhdfs.pipe_file(path, b"after")
    assert webhdfs.cat_file(path) == b"after"


def failure_verdict(output: str) -> dict[str, Any]:
    """Who failed (kafka2pc, whose Python traceback is in the driver's output, or Spark's own Hadoop client), whether
    retriably (kafka2pc: one of its retriable errors named; Spark: an I/O error of its store), and the error."""
    by_kafka2pc = "Traceback" in output and "kafka2pc/" in output
    named = [name for name in RETRIABLE_KAFKA2PC if re.search(rf"\b{name}\b", output)]
    said = next((line for line in output.splitlines() if line.startswith("query failed:")), "")
    return {"failed_in": "kafka2pc" if by_kafka2pc else "spark", "error": said[:300], "kafka2pc_errors": named,
            "retriable": bool(named) if by_kafka2pc else bool(named or SPARK_STORE_IO.search(output))}


def batches_done(driver: Any) -> list[int]:
    """The batch ids the driver has printed so far."""
    text = driver.stdout_path.read_text(errors="replace") if driver.stdout_path.exists() else ""
    return [int(match[1]) for match in re.finditer(r"(?m)^batch (\d+):", text)]


def outage_round(server: Any, driver: Any, rng: random.Random) -> dict[str, Any]:
    """After a random 0-2 s, the store down for a random 2-6 s; then (up to 120 s) whether the driver went on (a
    later batch done) or failed, which it may only do loudly and retriably. Returns the figures."""
    delay_s, length_s = rng.uniform(0.0, 2.0), rng.uniform(2.0, 6.0)
    time.sleep(delay_s)
    done_before = max(batches_done(driver), default=-1)
    with server.outage():
        time.sleep(length_s)
    stopped, serving = server.outages[-1]
    figure: dict[str, Any] = {"store": server.name, "delay_s": round(delay_s, 2), "asked_s": round(length_s, 2),
                              "down_s": round(serving - stopped, 2), "last_batch_before": done_before}
    outcome, deadline = "hung", time.monotonic() + 120
    while time.monotonic() < deadline:
        later = [b for b in batches_done(driver) if b > done_before]
        if later:
            outcome, figure["next_batch"] = "went on", later[0]
            break
        if driver.returncode is not None:
            outcome = "failed"
            break
        time.sleep(0.2)
    figure["outcome"] = outcome
    output = driver.output_tail(400)
    if outcome == "failed":
        figure.update(exit_code=driver.returncode, **failure_verdict(output))
    assert outcome != "hung", f"the driver neither went on nor exited within 120 s: {figure}\n{output}"
    assert not FORBIDDEN.search(output), f"the outage became a lasting failure: {figure}\n{output}"
    assert figure.get("retriable", True), f"the driver did not fail with a retriable error: {figure}\n{output}"
    return figure


def test_the_main_job_goes_on_or_fails_retriably_through_a_storage_outage(store, kafka, topic_factory, tmp_path):
    pytest.importorskip("pyspark")
    from kafka2pc_harness.spark import DriverProcess, run_driver  # noqa: PLC0415

    from .spark_support import audit, open_transactions, produce_orders, wait_for_open_transaction  # noqa: PLC0415

    server, checkpoint, env = store
    seed = int(os.environ.get("KAFKA2PC_OUTAGE_SEED", str(time.time_ns() % 1_000_000)))
    rng = random.Random(seed)
    bootstrap = kafka.bootstrap_servers
    source, sink = topic_factory(kafka, partitions=2), topic_factory(kafka, partitions=2)
    produce_orders(bootstrap, source, 0, RECORDS)
    args = ["--bootstrap", bootstrap, "--source", source, "--sink", sink, "--checkpoint", checkpoint,
            "--batch-size", "150", "--trigger-seconds", "0.3"]
    driver: DriverProcess | None = None
    prefixes: set[str] = set()
    figures: list[dict[str, Any]] = []
    try:
        for round_number in range(OUTAGES):
            if driver is None or driver.returncode is not None:
                driver = run_driver(JOB, args, env=env, log_dir=tmp_path / f"run-{round_number}")
            driver.wait_for_line(r"^batch \d+:", timeout_s=180)
            state = SinkStore(checkpoint).load()
            assert state is not None, f"no sink state under {checkpoint} after a batch"
            prefixes.add(state.prefix)
            wait_for_open_transaction(bootstrap, state.prefix, timeout_s=60)
            figure = outage_round(server, driver, rng)
            figures.append({"seed": seed, "round": round_number, **figure})
            print(f"\noutage: {figures[-1]}")
        if driver is not None and driver.returncode is None:
            # it went on: SIGKILL its whole process group inside a transaction (the kill test this one replaces in
            # the default suite), so the final run also recovers from a crash after the outage
            killed_in = wait_for_open_transaction(bootstrap, next(iter(prefixes)), timeout_s=60)
            killed = driver.kill_group()
            print(f"driver went on after the outage; SIGKILLed ({len(killed)} processes) with {killed_in} open")
    finally:
        if driver is not None and driver.returncode is None:
            driver.kill_group()
    final = run_driver(JOB, [*args, "--until-caught-up"], env=env, log_dir=tmp_path / "final")
    assert final.wait(timeout_s=300) == 0, final.output_tail()
    state = SinkStore(checkpoint).load()
    assert state is not None
    prefixes.add(state.prefix)
    report = audit(bootstrap, sink, RECORDS)
    left = {prefix: open_transactions(bootstrap, prefix) for prefix in sorted(prefixes)}
    print(f"\naudit after {len(figures)} outage(s): records {report['records']}, duplicates {report['duplicates']}, "
          f"gaps {report['gaps']}, clean {report['clean']}, prefixes {sorted(prefixes)}, open {left}")
    assert (report["records"], report["duplicates"], report["gaps"], report["clean"]) == (RECORDS, 0, 0, True)
    assert len(prefixes) == 1, f"the sink state was written anew: prefixes {sorted(prefixes)}"
    assert all(not ids for ids in left.values()), left
