"""Issue 32, part 1: a rolling restart of the 3-node KRaft cluster (RF 3, min.insync.replicas 2) under running jobs.

Each broker in turn is SIGTERMed (a controlled shutdown), started again, and once the cluster has it registered
(``wait_ready``) and back in every in-sync replica set of the job's topics and of ``__transaction_state``, its
preferred leaderships are given back to it (what the controller's imbalance check does within 5 minutes), so the job
has to work with it again before the next broker goes. Then the node coordinating most of the job's transactional
ids is SIGKILLed and kept down for KILLED_DOWN_S, longer than broker.session.timeout.ms (6 s): the cluster fences it
and every metadata answer drops it (kafka-python's broker map forgets it, the case of fa77571), then it is started
again the same way. At the end the cluster has its 3 nodes and its preferred leaders again.

Per event the test prints: the node, how long it was down (from the signal until the cluster had it registered
again), the errors the application saw meanwhile by class, and how soon after it led its partitions (and, for the
dual writers, its coordinators) again a transaction through it committed; the next event waits for that (the pool
must manage it within WORKS_WITHIN_S). Measured: the pool's producers find the returned node by themselves (a
failed produce refreshes their metadata), so this test also passes with fa77571's refresh taken out;
test_cluster_node_return.py is the one that guards it. With NOT_LEADER_OR_FOLLOWER read as an unknown failure
(kafka2pc._core.codes), every part of this test fails: the application sees TransactionAbortableError.

- The default suite: a DualWriterPool of THREADS threads on PostgreSQL (on SQLite the writers queue for its one write
  lock, held over each Kafka transaction, so one writer's retries stall the others and blur the per-id figures), each
  transaction an order row and one record of the order in each partition of a 3-partition topic (so every
  transaction goes through every partition leader). The
  application may see only RetriableError (asserted), and at the end the database's ids are the keys read_committed
  sees in every partition, without duplicates, and nothing is left open under the pool's prefix or pins an LSO.
- ``KAFKA2PC_ROLLING_SPARK=1`` (``make chaos``): the same restart under the Spark streaming job (Kafka source ->
  kafka2pc, examples/spark_job.py) and under keyed Spark batch writes run one after another
  (spark_batch_rolling_job.py); each ends with 0 duplicates, 0 gaps, nothing pinned, and either the query alive or
  failed with a retriable error and exact after a restart (the test says which, and why).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
from kafka.admin import KafkaAdminClient

import kafka2pc.errors
from kafka2pc._wire.kafka_settings import kafka_python_kwargs
from kafka2pc.cluster import ClusterClient
from kafka2pc.config import ClientConfig
from kafka2pc.dualwrite import DualWriterPool
from kafka2pc.errors import RetriableError
from kafka2pc.testing.verify import end_offsets, read_records
from kafka2pc.transaction_control import OPEN_STATES, TransactionControl
from tests.integration.test_dual_write import create_orders, schema_database

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

SPARK = os.environ.get("KAFKA2PC_ROLLING_SPARK", "") not in ("", "0")
TRANSACTION_STATE = "__transaction_state"
UNKNOWN_TOPIC_OR_PARTITION = 3
#: longer than broker.session.timeout.ms (6 s in the harness): the killed node is fenced and metadata drops it
KILLED_DOWN_S = 8.0
#: how soon after a node leads its partitions again a transaction through it must have committed
WORKS_WITHIN_S = 10.0
THREADS, PARTITIONS = 3, 3
#: kafka2pc's errors by name, and the retriable ones
KAFKA2PC_ERRORS = {name: value for name, value in vars(kafka2pc.errors).items()
                   if isinstance(value, type) and issubclass(value, kafka2pc.errors.Kafka2pcError)}
RETRIABLE = sorted(name for name, value in KAFKA2PC_ERRORS.items() if issubclass(value, RetriableError))


# -- the cluster's events ---------------------------------------------------------------------------------------------

@attrs.define
class Event:
    """One broker stopped (SIGTERM) or killed (SIGKILL) and started again; times from ``time.time()``."""

    node: int
    how: str
    signalled: float
    gone: float = 0.0  #: its process exited
    ready: float = 0.0  #: the cluster had it registered again (wait_ready returned)
    in_sync: float = 0.0  #: it was back in every in-sync replica set of the watched topics
    leading: float = 0.0  #: its preferred leaderships were given back
    #: of the watched ids, those it coordinated before the event (the SIGKILL's choice) and after it led again
    coordinated_before: tuple[str, ...] = ()
    coordinated_after: tuple[str, ...] = ()
    #: the partitions of the job's topics it led once it led again (``topic-partition``)
    led: tuple[str, ...] = ()

    @property
    def down_s(self) -> float:
        return self.ready - self.signalled

    def describe(self) -> str:
        return (f"{self.how} node {self.node}: gone after {self.gone - self.signalled:.1f} s, down {self.down_s:.1f} s "
                f"(signal -> registered again), in every ISR {self.in_sync - self.ready:.1f} s later, leading again "
                f"{self.leading - self.in_sync:.1f} s later")


@contextlib.contextmanager
def admin_of(kafka: Any) -> Iterator[KafkaAdminClient]:
    admin = KafkaAdminClient(**kafka_python_kwargs(ClientConfig.from_dict(kafka.client_config)),
                             client_id="rolling-restart-test")
    try:
        yield admin
    finally:
        admin.close()


def out_of_sync(kafka: Any, topics: Sequence[str]) -> list[str]:
    """The partitions of ``topics`` whose in-sync replicas are not all the cluster's nodes (a fresh client's view)."""
    with admin_of(kafka) as admin:
        described = admin.describe_topics(list(topics))
    lagging = [f"{topic['name']}-{p['partition_index']}: isr {sorted(p['isr_nodes'])}"
               for topic in described for p in topic["partitions"]
               if sorted(p["isr_nodes"]) != sorted(kafka.node_ids)]
    # __transaction_state is made by the cluster's first transaction
    return lagging or [f"{topic['name']}: error {topic['error_code']}" for topic in described if topic["error_code"]
                       and (topic["name"], topic["error_code"]) != (TRANSACTION_STATE, UNKNOWN_TOPIC_OR_PARTITION)]


def wait_in_sync(kafka: Any, topics: Sequence[str], within_s: float = 90) -> None:
    deadline = time.monotonic() + within_s
    while lagging := out_of_sync(kafka, topics):
        if time.monotonic() > deadline:
            raise AssertionError(f"ISRs not whole after {within_s:g} s: {lagging}")
        time.sleep(0.2)


def elect_preferred_leaders(kafka: Any, topics: Sequence[str] | None) -> None:
    with admin_of(kafka) as admin:
        admin.elect_leaders(0, list(topics) if topics is not None else None, timeout_ms=30_000, raise_errors=False)


def coordinators(kafka: Any, transactional_ids: Sequence[str]) -> dict[str, int]:
    """Each id's transaction coordinator, as a new client finds it."""
    with ClusterClient(ClientConfig.from_dict(kafka.client_config)) as probe:
        return {txn_id: probe.transaction_coordinator(txn_id, refresh=True) for txn_id in transactional_ids}


def until(what: str, condition: Callable[[], object], within_s: float, pause_s: float = 0.2) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within_s:g} s waiting for {what}")
        time.sleep(pause_s)


class RollingRestart:
    """The events, in order, on ``kafka`` (the ``kafka_3node`` fixture): every node SIGTERMed and started again, then a
    SIGKILL of the node coordinating most of ``watched_ids()``, kept down KILLED_DOWN_S. ``topics``: the job's, whose
    ISRs must be whole again before the next event (with min.insync.replicas 2 a second node down would otherwise
    refuse every write, which is an operator's mistake, not this test's case). After each event the next waits until
    ``worked_with(event)`` (the job did something through the node since it led again), up to ``settle_s``."""

    def __init__(self, kafka: Any, topics: Sequence[str], watched_ids: Callable[[], Sequence[str]],
                 worked_with: Callable[[Event], bool], settle_s: float):
        self.kafka = kafka
        self.topics = [*topics, TRANSACTION_STATE]
        self.watched_ids = watched_ids
        self.worked_with, self.settle_s = worked_with, settle_s
        self.events: list[Event] = []
        self.finished = 0.0

    def run(self) -> list[Event]:
        for node in self.kafka.node_ids:
            self._event(node, "SIGTERM")
        owners = coordinators(self.kafka, self.watched_ids())
        assert owners, "no transactional ids to choose the SIGKILL's node by"
        counts = Counter(owners.values())
        victim = max(sorted(counts), key=lambda node: counts[node])
        self._event(victim, "SIGKILL", tuple(sorted(i for i, node in owners.items() if node == victim)))
        self.finished = time.time()
        return self.events

    def _event(self, node: int, how: str, coordinated: tuple[str, ...] = ()) -> None:
        event = Event(node, how, time.time(), coordinated_before=coordinated)
        self.events.append(event)
        if how == "SIGTERM":
            self.kafka.stop_node(node)
        else:
            self.kafka.kill_node(node)
        event.gone = time.time()
        if how == "SIGKILL":
            time.sleep(KILLED_DOWN_S)
        self.kafka.start_node(node)
        self.kafka.wait_ready()
        event.ready = time.time()
        wait_in_sync(self.kafka, self.topics)
        event.in_sync = time.time()
        elect_preferred_leaders(self.kafka, self.topics)
        event.leading = time.time()
        event.led = tuple(f"{topic}-{partition}" for topic in self.topics[:-1]
                          for partition, leader in sorted(leaders(self.kafka, topic).items()) if leader == node)
        ids = self.watched_ids()
        event.coordinated_after = tuple(sorted(i for i, owner in coordinators(self.kafka, ids).items()
                                               if owner == node))
        # the job works with it again before the next event (up to settle_s; the test judges the time it took)
        deadline = time.monotonic() + self.settle_s
        while not self.worked_with(event) and time.monotonic() < deadline:
            time.sleep(0.1)

    def window(self, index: int) -> tuple[float, float]:
        """The times an event covers: from its signal to the next event's (the last one: to the end of the roll)."""
        end = self.events[index + 1].signalled if index + 1 < len(self.events) else self.finished
        return self.events[index].signalled, end


def restore(kafka: Any) -> None:
    """Three running nodes, every ISR whole and the preferred leaders leading, as the next test expects."""
    for node_id, node in kafka.nodes.items():
        if not node.running:
            kafka.start_node(node_id)
    kafka.wait_ready()
    wait_in_sync(kafka, [TRANSACTION_STATE])
    elect_preferred_leaders(kafka, None)


def leaders(kafka: Any, topic: str) -> dict[int, int]:
    with ClusterClient(ClientConfig.from_dict(kafka.client_config)) as probe:
        return probe.partition_leaders(topic)


# -- (a) a DualWriterPool under load ------------------------------------------------------------------------------

@attrs.frozen
class Commit:
    order: int
    transactional_id: str
    begun: float
    ended: float


@attrs.frozen
class Failure:
    order: int
    at: float
    error: str
    retriable: bool
    message: str


class PoolLoad:
    """THREADS threads writing orders through ``pool`` until stopped, each order a row and one record per partition."""

    def __init__(self, pool: DualWriterPool, topic: str, insert: str):
        self.pool, self.topic, self.insert = pool, topic, insert
        self.commits: list[Commit] = []
        self.failures: list[Failure] = []
        self.stop = threading.Event()
        self._orders = iter(range(10**9))
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._serve, name=f"request-{n}", daemon=True)
                        for n in range(THREADS)]

    def _serve(self) -> None:
        while not self.stop.is_set():  # bounded by the test, which sets stop
            with self._lock:
                order = next(self._orders)
            begun = time.time()
            try:
                with self.pool.transaction() as tx:
                    transactional_id = tx._producer.transactional_id  # which id (and so which coordinator) served it
                    tx.cursor.execute(self.insert, (order, order % 100))
                    for partition in range(PARTITIONS):
                        tx.produce(self.topic, value=b'{"id": %d}' % order, key=str(order).encode(),
                                   partition=partition)
            except Exception as exc:  # counted by class; the test asserts they are retriable
                with self._lock:
                    self.failures.append(Failure(order, time.time(), type(exc).__name__,
                                                 isinstance(exc, RetriableError), str(exc)[:300]))
                self.stop.wait(0.2)
            else:
                with self._lock:
                    self.commits.append(Commit(order, transactional_id, begun, time.time()))

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=120)
        assert not any(thread.is_alive() for thread in self.threads), "a request thread did not finish"


def open_under(kafka: Any, prefix: str) -> list[str]:
    """The ids ``<prefix>-...`` with a transaction open now (ListTransactions on every broker)."""
    with ClusterClient(ClientConfig.from_dict(kafka.client_config)) as client:
        return sorted(t.transactional_id for t in TransactionControl(client).list(states=OPEN_STATES)
                      if t.transactional_id.startswith(f"{prefix}-"))


def pinned(kafka: Any, topic: str) -> dict[int, tuple[int, int]]:
    """Partitions whose last stable offset stays behind the log end (after 10 s for markers being written)."""
    committed = end_offsets(kafka, topic, settle_s=10)
    written = end_offsets(kafka, topic, isolation="read_uncommitted")
    return {p: (committed[p], written[p]) for p in written if committed[p] != written[p]}


def test_a_dual_writer_pool_under_load_goes_through_a_rolling_restart_and_a_coordinator_kill(
        kafka_3node, postgres_dsn, topic_factory, record_property):
    kafka = kafka_3node
    restore(kafka)  # earlier tests may have left leaders moved
    topic = topic_factory(kafka, partitions=PARTITIONS, replication_factor=3)
    db, _ = schema_database(postgres_dsn)
    create_orders(db)
    prefix = f"roll{uuid.uuid4().hex[:6]}"
    pool = DualWriterPool(db.connect,
                          {"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": prefix, "linger.ms": 0},
                          size=THREADS, min_size=THREADS)
    load = PoolLoad(pool, topic, db.sql("INSERT INTO orders (id, amount) VALUES (?, ?)"))
    roll = RollingRestart(kafka, [topic], lambda: pool.transactional_ids,
                          lambda event: worked_with(load, event), WORKS_WITHIN_S)
    try:
        load.start()
        until("the pool's first commits", lambda: len(load.commits) >= 2 * THREADS, 30)
        roll.run()
        after_roll = len(load.commits)
        until("commits after the roll", lambda: len(load.commits) >= after_roll + 2 * THREADS, 30)
    finally:
        load.finish()
        pool.close()
        restore(kafka)

    report = pool_report(roll, load)
    print("\n" + "\n".join(report))
    record_property("ci_summary", "\n".join(report))

    wrong = [f for f in load.failures if not f.retriable]
    assert not wrong, (f"the application saw errors that are not RetriableError: "
                       f"{dict(Counter(f.error for f in wrong))}, first {wrong[:3]}")
    db_ids = db.ids()
    records = read_records(kafka, topic, timeout_s=60)
    for partition in range(PARTITIONS):
        keys = [int(r.key) for r in records if r.partition == partition]
        assert len(keys) == len(set(keys)), f"partition {partition}: duplicates {Counter(keys).most_common(3)}"
        assert sorted(keys) == db_ids, f"partition {partition}: keys {len(keys)} != database ids {len(db_ids)}"
    acknowledged = {c.order for c in load.commits}
    assert acknowledged <= set(db_ids)
    assert not {f.order for f in load.failures} & set(db_ids), "an order whose request failed retriably was written"
    assert open_under(kafka, prefix) == []
    assert pinned(kafka, topic) == {}
    for index, event in enumerate(roll.events):
        assert event.led, f"{event.describe()}: it led no partition of {topic} again"
        for ids in (None, event.coordinated_after or None):
            worked = first_commit_after(load.commits, event.leading, ids)
            assert worked is not None and worked.ended - event.leading < WORKS_WITHIN_S, \
                f"{event.describe()}: no transaction through it (ids {ids or 'any'}) committed within " \
                f"{WORKS_WITHIN_S:g} s of its return"
        if index == len(roll.events) - 1:
            assert event.coordinated_before, "the SIGKILLed node coordinated none of the pool's ids"


def worked_with(load: PoolLoad, event: Event) -> bool:
    """A commit begun after the node led again (through it as a partition leader: every transaction writes to every
    partition), and one by an id it coordinates then, if it coordinates any."""
    return first_commit_after(load.commits, event.leading) is not None and (
        not event.coordinated_after
        or first_commit_after(load.commits, event.leading, event.coordinated_after) is not None)


def first_commit_after(commits: Sequence[Commit], since: float, ids: Sequence[str] | None = None) -> Commit | None:
    """The first commit of a transaction begun after ``since`` (by one of ``ids``, if given)."""
    later = [c for c in commits if c.begun >= since and (ids is None or c.transactional_id in ids)]
    return min(later, key=lambda c: c.ended, default=None)


def pool_report(roll: RollingRestart, load: PoolLoad) -> list[str]:
    lines = [f"DualWriterPool, {THREADS} threads, PostgreSQL: {len(load.commits)} transactions committed, "
             f"{len(load.failures)} requests failed: {dict(Counter(f.error for f in load.failures))}"]
    for index, event in enumerate(roll.events):
        start, end = roll.window(index)
        errors = Counter(f.error for f in load.failures if start <= f.at < end)
        ends = sorted(c.ended for c in load.commits if start <= c.ended < end)
        committed = len(ends)
        pause = max((b - a for a, b in zip([start, *ends], [*ends, end], strict=True)), default=end - start)
        through_leader = first_commit_after(load.commits, event.leading)
        through_coordinator = first_commit_after(load.commits, event.leading, event.coordinated_after)
        chosen = f"; it coordinated {list(event.coordinated_before)}" if event.coordinated_before else ""
        as_leader = (f"{through_leader.ended - event.leading:.2f} s after it led again "
                     f"({through_leader.ended - event.ready:.1f} s after it was registered)" if through_leader
                     else "never")
        as_coordinator = (f"{through_coordinator.ended - event.leading:.2f} s after" if through_coordinator
                          else "none")
        lines.append(f"{event.describe()}{chosen}; meanwhile {committed} committed (longest time without a commit "
                     f"{pause:.1f} s), errors {dict(errors) or 'none'}; first commit through it as leader of "
                     f"{list(event.led)}: {as_leader}; as coordinator of {list(event.coordinated_after)}: "
                     f"{as_coordinator}")
    samples = [f"{f.error}: {f.message}" for f in load.failures[:3]]
    if samples:
        lines.append(f"first errors: {samples}")
    return lines


# -- (b) and (c) the Spark jobs (make chaos) --------------------------------------------------------------------------

SPARK_JOB = Path(__file__).resolve().parents[2] / "examples" / "spark_job.py"
BATCH_JOB = Path(__file__).with_name("spark_batch_rolling_job.py")
STREAMED_ORDERS = 3000
#: how long after a node leads again the next event waits for the Spark job's next batch or write
SPARK_SETTLE_S = 60.0
#: the kafka2pc errors a Spark job's output names
NAMED = re.compile(r"\b(" + "|".join(sorted(KAFKA2PC_ERRORS, key=len, reverse=True)) + r")\b")


def named_errors(text: str) -> list[str]:
    return sorted(set(NAMED.findall(text)))


def error_line(text: str) -> str:
    """The first line of a driver's output that says which kafka2pc error ended it, and why."""
    said = re.compile(r"\b(" + NAMED.pattern + r"): .*")
    return next((match[0] for line in text.splitlines() if (match := said.search(line))), "")[:400]


class LineClock:
    """When each line of a driver's stdout appeared (polled every 0.2 s on a thread): ``(time.time(), line)``."""

    def __init__(self, stdout: Path):
        self.stdout, self.lines = stdout, []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        seen = 0
        while not self.stop.wait(0.2):  # until the test stops it
            text = self.stdout.read_text(errors="replace") if self.stdout.exists() else ""
            complete = text.split("\n")[:-1]
            now = time.time()
            self.lines.extend((now, line) for line in complete[seen:])
            seen = len(complete)

    def matching(self, pattern: str) -> list[tuple[float, re.Match[str]]]:
        regex = re.compile(pattern)
        return [(at, match) for at, line in list(self.lines) if (match := regex.search(line))]

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


def sink_ids(kafka: Any, prefix_of: Callable[[], str | None]) -> list[str]:
    """The transactional ids the sink has used under its prefix (any state)."""
    from kafka2pc.sink.integration import TransactionalIdGrammar  # noqa: PLC0415

    prefix = prefix_of()
    if prefix is None:
        return []
    grammar = TransactionalIdGrammar(prefix)
    with ClusterClient(ClientConfig.from_dict(kafka.client_config)) as client:
        return sorted(t.transactional_id for t in TransactionControl(client).list()
                      if grammar.owns(t.transactional_id))


def spark_event_lines(roll: RollingRestart, progress: Sequence[float], failures: Sequence[tuple[float, str]],
                      unit: str) -> list[str]:
    """Per event: the figures, the failures (by class) in its window, and the first progress after it led again."""
    lines = []
    for index, event in enumerate(roll.events):
        start, end = roll.window(index)
        errors = Counter(name for at, name in failures if start <= at < end)
        done = sum(1 for at in progress if start <= at < end)
        after = [at for at in progress if at >= event.leading]
        chosen = f"; it coordinated {len(event.coordinated_before)} of the sink's ids" if event.coordinated_before \
            else ""
        first = (f"{min(after) - event.leading:.2f} s after it led again ({min(after) - event.ready:.1f} s after "
                 "it was registered)" if after else "never")
        lines.append(f"{event.describe()}{chosen}; meanwhile {done} {unit} done, errors {dict(errors) or 'none'}; "
                     f"the first done after it led again: {first}")
    return lines


@attrs.define
class StreamingRun:
    """The streaming job's driver through the roll: whether it stayed alive, or when it was seen to have exited."""

    driver: Any
    clock: LineClock
    exited_at: float | None = None

    def batches(self) -> list[float]:
        return [at for at, _ in self.clock.matching(r"^batch \d+:")]

    def gone(self) -> bool:
        """Whether the driver exited (noting when this was first seen)."""
        if self.driver.returncode is not None:
            self.exited_at = self.exited_at or time.time()
            return True
        return False

    def worked_since(self, since: float) -> bool:
        """A batch done after ``since``; or the driver gone (nothing to wait for)."""
        return self.gone() or any(at >= since for at in self.batches())


@pytest.mark.skipif(not SPARK, reason="make chaos (KAFKA2PC_ROLLING_SPARK=1): the Spark jobs through a rolling restart")
@pytest.mark.timeout(1200)
def test_the_spark_streaming_job_goes_through_a_rolling_restart_and_a_coordinator_kill(kafka_3node, topic_factory,
                                                                                       tmp_path, record_property):
    pytest.importorskip("pyspark")
    from kafka2pc_harness.spark import run_driver  # noqa: PLC0415

    from .spark_support import audit, open_transactions, produce_orders, sink_prefix  # noqa: PLC0415

    kafka = kafka_3node
    restore(kafka)
    bootstrap = kafka.bootstrap_servers
    source = topic_factory(kafka, partitions=3, replication_factor=3)
    sink = topic_factory(kafka, partitions=3, replication_factor=3)
    checkpoint = tmp_path / "checkpoint"
    produce_orders(bootstrap, source, 0, STREAMED_ORDERS)  # a backlog that keeps the query busy through the roll
    job_args = ["--bootstrap", bootstrap, "--source", source, "--sink", sink, "--checkpoint", str(checkpoint),
                "--batch-size", "20", "--trigger-seconds", "0.5"]

    def prefix() -> str | None:
        try:
            return sink_prefix(checkpoint)
        except AssertionError:  # not pinned yet
            return None

    driver = run_driver(SPARK_JOB, job_args, log_dir=tmp_path / "run")
    run = StreamingRun(driver, LineClock(driver.stdout_path))
    roll = RollingRestart(kafka, [source, sink], lambda: sink_ids(kafka, prefix),
                          lambda event: run.worked_since(event.leading), SPARK_SETTLE_S)
    try:
        driver.wait_for_line(r"^batch \d+:", timeout_s=240)
        roll.run()
        # alive: it works through the backlog, then sits idle (no new input: no batch, no transaction open)
        until("the backlog written, or the query gone",
              lambda: run.gone() or audit(bootstrap, sink, STREAMED_ORDERS)["records"] >= STREAMED_ORDERS, 600,
              pause_s=5)
    finally:
        restore(kafka)
        run.clock.close()
        alive = driver.returncode is None
        if alive:
            driver.kill_group()  # idle by now: nothing of it is open
    output = driver.output_tail(400)
    named = [] if alive else named_errors(output)
    lines = [f"Spark streaming job (Kafka source -> kafka2pc), {STREAMED_ORDERS} orders in batches of 20: "
             + ("the query stayed ALIVE through every event and wrote the backlog" if alive else
                f"the query FAILED (exit {driver.returncode}), seen {run.exited_at - roll.events[0].signalled:.0f} s "
                f"after the first event; kafka2pc errors named {named} (retriable: {all_retriable(named)}): "
                + error_line(output))]
    if not alive:
        final = run_driver(SPARK_JOB, [*job_args, "--until-caught-up"], log_dir=tmp_path / "final")
        assert final.wait(timeout_s=600) == 0, final.output_tail()
        lines.append("restarted from its checkpoint with --until-caught-up: exit 0")
    failures = [] if alive else [(run.exited_at or time.time(), ",".join(named) or "unnamed")]
    lines += spark_event_lines(roll, run.batches(), failures, "batches")
    report = audit(bootstrap, sink, STREAMED_ORDERS)
    left = open_transactions(bootstrap, sink_prefix(checkpoint))
    lines.append(f"audit: {report['records']} records, {report['duplicates']} duplicates, {report['gaps']} gaps, "
                 f"pinned {report['lso_pinned']}; open under the prefix {left}")
    print("\n" + "\n".join(lines))
    record_property("ci_summary", "\n".join(lines))
    assert alive or all_retriable(named), f"the query failed without a retriable kafka2pc error:\n{output}"
    assert (report["records"], report["duplicates"], report["gaps"], report["outside_range"]) == \
        (STREAMED_ORDERS, 0, 0, 0)
    assert report["lso_pinned"] == [] and report["clean"]
    assert left == []


def all_retriable(names: Sequence[str]) -> bool:
    """Whether every kafka2pc error named is retriable (and one is named)."""
    return bool(names) and all(name in RETRIABLE for name in names)


@pytest.mark.skipif(not SPARK, reason="make chaos (KAFKA2PC_ROLLING_SPARK=1): the Spark jobs through a rolling restart")
@pytest.mark.timeout(1200)
def test_spark_batch_writes_go_through_a_rolling_restart_and_a_coordinator_kill(kafka_3node, topic_factory, tmp_path,
                                                                                record_property):
    pytest.importorskip("pyspark")
    from kafka2pc_harness.spark import run_driver  # noqa: PLC0415

    from .spark_support import audit, open_transactions, sink_prefix  # noqa: PLC0415

    kafka = kafka_3node
    restore(kafka)
    bootstrap = kafka.bootstrap_servers
    topic = topic_factory(kafka, partitions=3, replication_factor=3)
    checkpoint, stop_file = tmp_path / "checkpoint", tmp_path / "stop"
    rows = 2000

    def prefix() -> str | None:
        return sink_prefix(checkpoint) if (checkpoint / "kafka2pc" / "sink.json").exists() else None

    driver = run_driver(BATCH_JOB, [bootstrap, topic, str(checkpoint), str(rows), str(stop_file)],
                        log_dir=tmp_path / "run")
    clock = LineClock(driver.stdout_path)
    roll = RollingRestart(kafka, [topic], lambda: sink_ids(kafka, prefix),
                          lambda event: driver.returncode is not None
                          or any(at >= event.leading for at, _ in clock.matching(r"^written \d+ ")), SPARK_SETTLE_S)
    try:
        driver.wait_for_line(r"^written 0 ", timeout_s=240)
        roll.run()
        stop_file.touch()
        exit_code = driver.wait(timeout_s=600)
    finally:
        restore(kafka)
        clock.close()
        if driver.returncode is None:
            driver.kill_group()
    output = driver.output_tail(400)
    assert exit_code == 0, output
    written = [(at, int(match[1])) for at, match in clock.matching(r"^written (\d+) ")]
    failed = [(at, match[2]) for at, match in clock.matching(r"^failed (\d+) attempt \d+: (\S+)")]
    versions = max(version for _, version in written) + 1
    assert sorted(version for _, version in written) == list(range(versions)), written
    expected = versions * rows
    wrong = [name for _, names in failed for name in names.split(",") if name not in RETRIABLE]
    lines = [f"Spark batch writes (keyed, {rows} rows each, run one after another): {versions} written, "
             f"{len(failed)} failed and were run again: {dict(Counter(name for _, name in failed))}; "
             + ("no write failed" if not failed else
                "every failure named only retriable kafka2pc errors, and each version was written again"
                if not wrong else f"failures named NON-retriable errors {sorted(set(wrong))}: {error_line(output)}")]
    lines += spark_event_lines(roll, [at for at, _ in written], failed, "writes")
    report = audit(bootstrap, topic, expected)
    left = open_transactions(bootstrap, sink_prefix(checkpoint))
    lines.append(f"audit: {report['records']} records of {expected}, {report['duplicates']} duplicates, "
                 f"{report['gaps']} gaps, pinned {report['lso_pinned']}; open under the prefix {left}")
    print("\n" + "\n".join(lines))
    record_property("ci_summary", "\n".join(lines))
    assert not wrong, f"batch writes failed with errors that are not retriable: {sorted(set(wrong))}\n{output}"
    assert (report["records"], report["duplicates"], report["gaps"], report["outside_range"]) == (expected, 0, 0, 0)
    assert report["lso_pinned"] == [] and report["clean"]
    assert left == []
