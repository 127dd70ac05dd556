"""Issue 32, part 5: the soak (``make soak``; skipped unless ``KAFKA2PC_SOAK_MINUTES`` is set).

For KAFKA2PC_SOAK_MINUTES (30 in ``make soak``) on the 3-node KRaft cluster (RF 3, min.insync.replicas 2), all at once:

- **the Spark streaming job** (examples/spark_job.py: Kafka source -> kafka2pc), fed orders without a pause by an
  idempotent producer (FEED_PER_S a second); a driver that exits is started again from its checkpoint (at most
  MAX_SPARK_STARTS times), and the errors its output named are counted;
- **the dual-write fleet**: FLEET processes of fleet_job.py on PostgreSQL, every one started with the same
  configuration (leased ids), each a DualWriterPool of 2 writers and 2 request threads;
- **random cluster events**, one at a time every EVENT_GAP_S (randomly within): a node SIGTERMed and started again, a
  node SIGKILLed and kept down 8 s, or a node SIGSTOPped for 10 s (longer than broker.session.timeout.ms) then
  SIGCONTed; after each, the node is waited for until it is registered, back in every ISR and leading its preferred
  partitions again (as in test_rolling_restart.py), so two nodes are never away at once.

A sampler lists the transactions open under the sink's and the fleet's prefixes every SAMPLE_S and reads their start
times (DescribeTransactions): "pinned" is how long the oldest of them had been open, the longest seen and the total
time with one open longer than PINNED_AFTER_S. The report, printed at the end (and kept as the test's ``soak_report``
property), counts records, duplicates, gaps, pinned time, errors by group (RetriableError, FatalError, ...: what the
caller should do), and each process's RSS and open file descriptors once warmed up and at the end.

Asserted: the sink topic holds every fed order exactly once (0 duplicates, 0 gaps, nothing pinned at the end); the
fleet's database ids are the keys read_committed consumers see, without duplicates, every acknowledged order among
them; the fleet saw only RetriableError; nothing is left open under either prefix; no fleet process's open file
descriptors grew by more than FD_SLACK.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import attrs
import pytest
from confluent_kafka import Producer

import kafka2pc.errors
from kafka2pc.cluster import ClusterClient
from kafka2pc.config import ClientConfig
from kafka2pc.sink.integration import TransactionalIdGrammar
from kafka2pc.transaction_control import OPEN_STATES, TransactionControl
from tests.integration.test_dual_write import create_orders, kafka_keys, schema_database
from tests.integration.test_rolling_restart import (
    KILLED_DOWN_S,
    TRANSACTION_STATE,
    elect_preferred_leaders,
    named_errors,
    restore,
    wait_in_sync,
)

MINUTES = float(os.environ.get("KAFKA2PC_SOAK_MINUTES", "0") or 0)
SEED = int(os.environ.get("KAFKA2PC_SOAK_SEED", str(random.randrange(1_000_000))))
pytestmark = [pytest.mark.integration, pytest.mark.cluster, pytest.mark.slow,
              pytest.mark.skipif(MINUTES <= 0, reason="make soak (KAFKA2PC_SOAK_MINUTES)"),
              pytest.mark.timeout(int(MINUTES * 60) + 1800)]

SPARK_JOB = Path(__file__).resolve().parents[2] / "examples" / "spark_job.py"
FLEET_JOB = Path(__file__).with_name("fleet_job.py")
FEED_PER_S = 40
FLEET, FLEET_THREADS, FLEET_SIZE, FLEET_LEASE_S, FLEET_WORK_S, FLEET_PAUSE_S = 3, 2, 2, 5.0, 0.02, 0.05
EVENT_GAP_S = (45.0, 90.0)
PAUSED_S = 10.0
SAMPLE_S = 5.0
PINNED_AFTER_S = 60.0
MAX_SPARK_STARTS = 10
WARM_S = min(120.0, MINUTES * 60 / 4)  # RSS and fds are read first after this
FD_SLACK = 16
ERRORS = {name: value for name, value in vars(kafka2pc.errors).items()
          if isinstance(value, type) and issubclass(value, kafka2pc.errors.Kafka2pcError)}
GROUPS = ("RetriableError", "TransactionAbortableError", "OutcomeUnknownError", "DecidedNotCompletedError",
          "FatalError", "UsageError")


def group_of(name: str) -> str:
    """What the caller should do about an error named ``name`` (its kafka2pc group; 'other' for any other class)."""
    kind = ERRORS.get(name)
    return next((group for group in GROUPS if kind is not None and issubclass(kind, ERRORS[group])), "other")


def process_figures(pid: int) -> tuple[int, int] | None:
    """(RSS in kB, open file descriptors) of a live process, or None."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
        return rss, len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration):
        return None


# -- the parts --------------------------------------------------------------------------------------------------------

class Feeder:
    """Orders 0, 1, 2 ... into the source topic, FEED_PER_S a second, by one idempotent producer for the whole soak
    (so none is written twice, whatever the cluster does); ``delivered`` counts the acknowledged ones."""

    def __init__(self, bootstrap: str, topic: str):
        self.topic, self.sent, self.delivered, self.failed = topic, 0, 0, 0
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20,
                                  "delivery.timeout.ms": 600_000})
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="feeder", daemon=True)

    def _done(self, error: Any, _message: Any) -> None:
        if error is None:
            self.delivered += 1
        else:
            self.failed += 1

    def _run(self) -> None:
        while not self.stop.wait(0.25):  # until the soak's end
            for _ in range(FEED_PER_S // 4):
                order = self.sent
                value = json.dumps({"id": order, "amount": order % 97 / 10})
                self.producer.produce(self.topic, key=str(order), value=value, on_delivery=self._done)
                self.sent += 1
            self.producer.poll(0)

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        self.producer.flush(600)


@attrs.define
class SparkJob:
    """The streaming job's driver, started again from its checkpoint whenever it exits (bounded)."""

    args: list[str]
    log_dir: Path
    driver: Any = None
    starts: int = 0
    exits: list[tuple[int | None, list[str]]] = attrs.Factory(list)

    def start(self) -> None:
        from kafka2pc_harness.spark import run_driver  # noqa: PLC0415

        self.starts += 1
        self.driver = run_driver(SPARK_JOB, self.args, log_dir=self.log_dir / f"start-{self.starts}")

    def keep_alive(self) -> None:
        if self.driver.returncode is not None and self.starts < MAX_SPARK_STARTS:
            self.exits.append((self.driver.returncode, named_errors(self.driver.output_tail(400))))
            self.start()

    def jvm_pid(self) -> int | None:
        table = self.driver.group_pids()
        return next((pid for pid in table if "java" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(
            errors="replace").split("\0")[0]), None) if table else None


class FleetProcesses:
    """FLEET fleet_job.py processes, one configuration, one PostgreSQL schema."""

    def __init__(self, url: str, bootstrap: str, topic: str, workdir: Path):
        self.prefix = f"soak-{os.urandom(3).hex()}"
        self.outs: list[Path] = []
        self.processes: list[subprocess.Popen[bytes]] = []
        for launch in range(FLEET):
            out, err = workdir / f"fleet-{launch}.out", workdir / f"fleet-{launch}.err"
            with open(err, "wb") as stderr:
                self.processes.append(subprocess.Popen(
                    [sys.executable, str(FLEET_JOB), url, bootstrap, topic, self.prefix, str(launch * 10_000_000),
                     str(out), *map(str, (FLEET_LEASE_S, FLEET_THREADS, FLEET_SIZE, FLEET_WORK_S, FLEET_PAUSE_S))],
                    stdout=stderr, stderr=stderr))
            self.outs.append(out)

    def lines(self) -> list[str]:
        return [line for out in self.outs if out.exists() for line in out.read_text().splitlines()]

    def tally(self) -> tuple[set[int], set[int], Counter[str]]:
        ok, decided, failed = set(), set(), Counter[str]()
        for line in self.lines():
            word, *rest = line.split()
            if word == "ok":
                ok.add(int(rest[0]))
            elif word == "decided":
                decided.add(int(rest[0]))
            elif word in ("fail", "startfail"):
                failed[rest[-1] if word == "fail" else rest[0]] += 1
        return ok, decided, failed

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=30)


@attrs.define
class Sampler:
    """Every SAMPLE_S: the transactions open under the prefixes and how long the oldest has been open."""

    kafka: Any
    prefixes: dict[str, Any]  # name -> callable returning the prefix (None while unknown)
    oldest_s: dict[str, float] = attrs.Factory(dict)
    pinned_s: dict[str, float] = attrs.Factory(dict)
    samples: int = 0
    missed: Counter[str] = attrs.Factory(Counter)
    stop: threading.Event = attrs.Factory(threading.Event)

    def run(self) -> None:
        with ClusterClient(ClientConfig.from_dict(self.kafka.client_config)) as client:
            control = TransactionControl(client)
            while not self.stop.wait(SAMPLE_S):  # until the soak's end
                try:
                    self._sample(control)
                except Exception as exc:  # a node away: the sample is missed, counted by class
                    self.missed[type(exc).__name__] += 1

    def _sample(self, control: TransactionControl) -> None:
        listed = control.list(states=OPEN_STATES)
        now_ms = time.time() * 1000
        self.samples += 1
        for name, prefix_of in self.prefixes.items():
            prefix = prefix_of()
            if prefix is None:
                continue
            grammar = TransactionalIdGrammar(prefix)
            ages = [now_ms - description.start_time_ms for t in listed
                    if (grammar.owns(t.transactional_id) or t.transactional_id.startswith(f"{prefix}-"))
                    and (description := control.describe_full(t.transactional_id)) is not None
                    and description.state in OPEN_STATES and description.start_time_ms > 0]
            oldest = max(ages, default=0.0) / 1000
            self.oldest_s[name] = max(self.oldest_s.get(name, 0.0), oldest)
            if oldest > PINNED_AFTER_S:
                self.pinned_s[name] = self.pinned_s.get(name, 0.0) + SAMPLE_S


# -- the cluster's events ---------------------------------------------------------------------------------------------

def cluster_event(kafka: Any, rng: random.Random, topics: list[str]) -> str:
    """One random event on one random node; returns it once the cluster is whole again."""
    node, how = rng.choice(list(kafka.node_ids)), rng.choice(["SIGTERM", "SIGKILL", "SIGSTOP"])
    started = time.monotonic()
    if how == "SIGTERM":
        kafka.stop_node(node)
        kafka.start_node(node)
    elif how == "SIGKILL":
        kafka.kill_node(node)
        time.sleep(KILLED_DOWN_S)
        kafka.start_node(node)
    else:
        pid = kafka.nodes[node].pid
        os.kill(pid, signal.SIGSTOP)
        time.sleep(PAUSED_S)
        os.kill(pid, signal.SIGCONT)
    kafka.wait_ready()
    wait_in_sync(kafka, [*topics, TRANSACTION_STATE], within_s=180)
    elect_preferred_leaders(kafka, [*topics, TRANSACTION_STATE])
    return f"{how} node {node} ({time.monotonic() - started:.0f} s until whole again)"


# -- the soak ---------------------------------------------------------------------------------------------------------

class Soak:
    """The parts together, for MINUTES: the events on the main thread, the sampler on its own."""

    def __init__(self, kafka: Any, db: Any, topics: dict[str, str], checkpoint: Path, workdir: Path):
        from .spark_support import sink_prefix  # noqa: PLC0415

        self.kafka, self.db, self.topics, self.checkpoint = kafka, db, topics, checkpoint
        self.rng = random.Random(SEED)
        bootstrap = kafka.bootstrap_servers

        def spark_prefix() -> str | None:
            try:
                return sink_prefix(checkpoint)
            except AssertionError:  # not pinned yet
                return None

        self.feeder = Feeder(bootstrap, topics["source"])
        self.spark = SparkJob(["--bootstrap", bootstrap, "--source", topics["source"], "--sink", topics["sink"],
                               "--checkpoint", str(checkpoint), "--batch-size", "500", "--trigger-seconds", "1"],
                              workdir / "spark")
        self.fleet = FleetProcesses(db.url, bootstrap, topics["orders"], workdir)
        self.sampler = Sampler(kafka, {"spark": spark_prefix, "fleet": lambda: self.fleet.prefix})
        self.sampling = threading.Thread(target=self.sampler.run, name="sampler", daemon=True)
        self.events: list[str] = []
        self.figures: dict[str, list[tuple[int, int] | None]] = {}

    def run(self) -> None:
        began = time.monotonic()
        end = began + MINUTES * 60
        print(f"\nsoak: {MINUTES:g} min, seed {SEED}", flush=True)
        try:
            self.feeder.thread.start()
            self.spark.start()
            self.sampling.start()
            self.spark.driver.wait_for_line(r"^batch \d+:", timeout_s=300)
            warm_until, next_event = began + WARM_S, began + self.rng.uniform(*EVENT_GAP_S)
            while time.monotonic() < end:  # bounded by the soak's length
                self.spark.keep_alive()
                if not self.figures and time.monotonic() >= warm_until:
                    self.figures = {name: [process_figures(pid)] for name, pid in pids(self.spark, self.fleet).items()}
                if time.monotonic() >= next_event:
                    event = cluster_event(self.kafka, self.rng, list(self.topics.values()))
                    self.events.append(f"{time.monotonic() - began:5.0f} s: {event}")
                    print(f"soak: {self.events[-1]}; fed {self.feeder.sent}, fleet acknowledged "
                          f"{len(self.fleet.tally()[0])}", flush=True)
                    next_event = time.monotonic() + self.rng.uniform(*EVENT_GAP_S)
                time.sleep(1)
            for name, pid in pids(self.spark, self.fleet).items():
                self.figures.setdefault(name, [None]).append(process_figures(pid))
        finally:
            self.feeder.finish()
            self.fleet.stop()
            restore(self.kafka)

    def settle(self) -> dict[str, Any]:
        """The Spark job caught up with every fed order (restarted meanwhile if it exits); its audit."""
        from .spark_support import audit  # noqa: PLC0415

        bootstrap, fed = self.kafka.bootstrap_servers, self.feeder.sent
        try:
            deadline = time.monotonic() + 600
            while audit(bootstrap, self.topics["sink"], fed)["records"] < fed and time.monotonic() < deadline:
                self.spark.keep_alive()
                time.sleep(10)
        finally:
            self.sampler.stop.set()
            self.sampling.join(timeout=60)
            if self.spark.driver.returncode is None:
                self.spark.driver.kill_group()  # caught up and idle by now: nothing of it is open
        return audit(bootstrap, self.topics["sink"], fed)


def test_the_streaming_job_and_the_fleet_through_random_cluster_events(kafka_3node, postgres_dsn, topic_factory,
                                                                     tmp_path, record_property):
    pytest.importorskip("pyspark")
    from .spark_support import open_transactions, sink_prefix  # noqa: PLC0415

    kafka = kafka_3node
    restore(kafka)
    bootstrap = kafka.bootstrap_servers
    topics = {name: topic_factory(kafka, partitions=3, replication_factor=3) for name in ("source", "sink", "orders")}
    db, _ = schema_database(postgres_dsn)
    create_orders(db)
    soak = Soak(kafka, db, topics, tmp_path / "checkpoint", tmp_path)
    soak.run()
    report = soak.settle()
    feeder, spark, fleet, sampler = soak.feeder, soak.spark, soak.fleet, soak.sampler
    fed = feeder.sent
    spark_left = open_transactions(bootstrap, sink_prefix(soak.checkpoint))
    ok, decided, failed = fleet.tally()
    db_ids = db.ids()
    keys = kafka_keys(bootstrap, topics["orders"])
    fleet_left = open_transactions(bootstrap, fleet.prefix)
    spark_errors = Counter(name for _, names in spark.exits for name in names)
    lines = [
        f"soak of {MINUTES:g} min (seed {SEED}), 3-node KRaft cluster, {len(soak.events)} cluster events:",
        *(f"  {event}" for event in soak.events),
        f"Spark streaming job: fed {fed} orders ({feeder.failed} not acknowledged by the source), sink "
        f"{report['records']} records, {report['duplicates']} duplicates, {report['gaps']} gaps, "
        f"{report['outside_range']} outside range, pinned at the end {report['lso_pinned']}, open under its prefix "
        f"{spark_left}; driver started {spark.starts} time(s), exits {spark.exits}",
        f"dual-write fleet ({FLEET} processes, one config): acknowledged {len(ok)}, decided-not-completed "
        f"{len(decided)}, failed {sum(failed.values())} {dict(failed)}; DB {len(db_ids)} rows, Kafka {len(keys)} "
        f"keys, {len(keys) - len(set(keys))} duplicates, acknowledged missing {len(ok - set(db_ids))}, open under "
        f"its prefix {fleet_left}",
        "errors by group: fleet " + str(dict(Counter(group_of(n) for n in failed.elements()))) + ", Spark "
        + str(dict(Counter(group_of(n) for n in spark_errors.elements()))) + f" {dict(spark_errors)}",
        f"pinned: oldest open transaction seen {', '.join(f'{n} {s:.1f} s' for n, s in sampler.oldest_s.items())}; "
        f"time with one open > {PINNED_AFTER_S:g} s: {dict(sampler.pinned_s) or 'none'}; {sampler.samples} samples, "
        f"missed {dict(sampler.missed) or 'none'}",
        "RSS / open fds (warmed up -> end): " + "; ".join(
            f"{name} {describe(values)}" for name, values in soak.figures.items()),
    ]
    print("\n".join(lines))
    record_property("soak_report", "\n".join(lines))
    assert (report["records"], report["duplicates"], report["gaps"], report["outside_range"]) == (fed, 0, 0, 0)
    assert report["lso_pinned"] == [] and spark_left == [] and fleet_left == []
    assert feeder.failed == 0
    assert len(keys) == len(set(keys)) and sorted(set(keys)) == db_ids and ok <= set(db_ids)
    assert all(group_of(name) == "RetriableError" for name in failed), dict(failed)
    for name, values in soak.figures.items():
        if name.startswith("fleet") and len(values) == 2 and None not in values:
            assert values[1][1] <= values[0][1] + FD_SLACK, f"{name}: open file descriptors {values}"


def pids(spark: SparkJob, fleet: FleetProcesses) -> dict[str, int]:
    found = {f"fleet-{n}": process.pid for n, process in enumerate(fleet.processes) if process.poll() is None}
    if spark.driver.returncode is None:
        found[f"spark driver (start {spark.starts})"] = spark.driver.pid
        jvm = spark.jvm_pid()
        if jvm is not None:
            found[f"spark JVM (start {spark.starts})"] = jvm
    return found


def describe(values: list[tuple[int, int] | None]) -> str:
    return " -> ".join("gone" if v is None else f"{v[0] / 1024:.0f} MB/{v[1]} fds" for v in values)

