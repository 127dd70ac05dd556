"""The fleet kill test of issue 29: a fleet of order-service processes (fleet_job.py) ALL started with the same
configuration ``{"bootstrap.servers": ..., "transactional.id": PREFIX, "linger.ms": 0}``, each a DualWriterPool of 2
writers and 2 request threads (a request: INSERT an order, produce its record keyed by the order id, 20 ms more work
inside the block), on a SQLite file and on a PostgreSQL schema. With no recovery call made by the test (only the
processes' own pools and their lease keepers), the fleet goes through:

 1. steady state;
 2. one process SIGKILLed at a random moment (once one of its transactions is in progress in Kafka), a replacement
    started at once;
 3. one process SIGSTOPped for lease_s + 5 s, then SIGCONT: it must go on serving (a fenced writer is replaced by a
    fresh lease);
 4. scale-down: one process stopped gracefully (SIGTERM: its threads stop, then pool.close()), not replaced;
 5. the whole fleet SIGKILLed, then ONE new process, whose keeper must settle everything; it is stopped gracefully.

Then: every acknowledged order (and every one reported decided) is in the database; the database's ids equal the keys
a read_committed consumer sees, without duplicates; at each death (the kill, the graceful stop, the whole-fleet kill)
the Kafka transactions open on the dead process's ids (rows whose holder is its host:pid) are noted by producer id
and epoch, and each must be ended within 30 s of the death (read_committed consumers unpinned); requests of healthy
processes (never killed, stopped or paused before the whole-fleet kill: the replacement and the last process
included) fail at most 2 %; the fleet made at most 2 x (peak concurrent writers) ids.

``KAFKA2PC_FLEET_LEASE_S`` sets the pools' lease_s (default 5; the 30 s target must hold with it),
``KAFKA2PC_FLEET_SEED`` the random choices, ``KAFKA2PC_FLEET_LOG`` the workers' kafka2pc log level. The test also
runs against a release without leases (PYTHONPATH at its src/): there the rows have no holder, so a death's ids are
all the fleet's ids; it then fails, with its figures printed first."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

import kafka2pc
from kafka2pc.cluster import ClusterClient
from kafka2pc.config import ClientConfig
from kafka2pc.transaction_control import ONGOING, OPEN_STATES, ObservedTransaction, TransactionControl
from tests.integration import test_dual_write
from tests.integration.test_dual_write import Database, kafka_keys

database = test_dual_write.database  # the fixture: a SQLite file, and a PostgreSQL schema of its own

pytestmark = pytest.mark.integration
JOB = Path(__file__).with_name("fleet_job.py")
LEASE_S = float(os.environ.get("KAFKA2PC_FLEET_LEASE_S", "5"))
SEED = int(os.environ.get("KAFKA2PC_FLEET_SEED", str(random.randrange(1_000_000))))
WORKERS, THREADS, SIZE = 4, 2, 2
WORK_S = 0.02  # a request's transaction stays open this long after its INSERT and its record (its other work)
REQUEST_PAUSE_S = 0.02  # between one thread's requests
STEADY_S = 3.0
UNPIN_WITHIN_S = 30.0
HEALTHY_FAILURES_AT_MOST = 0.02
STATE_TABLE = "kafka2pc_dual_write_state"
HOST = socket.gethostname()


@attrs.define
class Tally:
    ok: set[int] = attrs.Factory(set)
    decided: set[int] = attrs.Factory(set)
    failed: Counter[str] = attrs.Factory(Counter)

    @property
    def requests(self) -> int:
        return len(self.ok) + len(self.decided) + sum(self.failed.values())


@attrs.define
class Worker:
    """One process of the fleet (fleet_job.py) and its record."""

    launch: int
    process: subprocess.Popen[bytes]
    out: Path
    err: Path
    role: str = "healthy"

    @property
    def holder(self) -> str:
        return f"{HOST}:{self.process.pid}"

    def lines(self) -> list[str]:
        return self.out.read_text().splitlines() if self.out.exists() else []

    def ready(self) -> bool:
        return any(line.startswith("ready ") for line in self.lines())

    def failed_start(self) -> str | None:
        return next((line for line in self.lines() if line.startswith("startfail ")), None)

    def tally(self) -> Tally:
        tally = Tally()
        for line in self.lines():
            word, *rest = line.split()
            if word == "ok":
                tally.ok.add(int(rest[0]))
            elif word == "decided":
                tally.decided.add(int(rest[0]))
            elif word == "fail":
                tally.failed[rest[1] if len(rest) > 1 else "?"] += 1
        return tally

    def served_since(self, count: int) -> bool:
        return len(self.tally().ok) > count

    def stderr_tail(self) -> str:
        return self.err.read_text()[-6000:] if self.err.exists() else ""


@attrs.define
class Death:
    """A process (or the whole fleet) gone: the Kafka transactions open on its ids then, and how long until none of
    them was still open (None: not within the bound)."""

    what: str
    at: float
    pinned: dict[str, tuple[int, int]]
    unpinned_s: float | None = None
    #: the transactions seen open on its ids just before the kill (the kill waits for one, up to 3 s)
    seen: dict[str, tuple[int, int]] = attrs.Factory(dict)


@attrs.frozen
class Row:
    transactional_id: str
    holder: str | None
    status: str


class Fleet:
    """The test's view of the fleet: its processes, its rows in the state table, its ids' Kafka transactions."""

    def __init__(self, db: Database, bootstrap: str, topic: str, workdir: Path, control: Any):
        self.db, self.bootstrap, self.topic, self.workdir, self.control = db, bootstrap, topic, workdir, control
        self.prefix = f"fleet-{os.urandom(3).hex()}"
        self.workers: list[Worker] = []
        self.peak_writers = 0

    def start(self, role: str = "healthy") -> Worker:
        launch = len(self.workers)
        out, err = self.workdir / f"worker-{launch}.out", self.workdir / f"worker-{launch}.err"
        with open(err, "wb") as stderr:
            process = subprocess.Popen(
                [sys.executable, str(JOB), self.db.url, self.bootstrap, self.topic, self.prefix,
                 str(launch * 10_000_000), str(out), *map(str, (LEASE_S, THREADS, SIZE, WORK_S, REQUEST_PAUSE_S))],
                stdout=stderr, stderr=stderr, env=os.environ.copy())
        worker = Worker(launch, process, out, err, role)
        self.workers.append(worker)
        self.peak_writers = max(self.peak_writers, SIZE * len(self.alive()))
        return worker

    def alive(self) -> list[Worker]:
        return [w for w in self.workers if w.process.poll() is None]

    def wait_ready(self, workers: list[Worker], within_s: float = 30.0) -> list[Worker]:
        """The workers not ready within ``within_s`` (their pool not made)."""
        deadline = time.monotonic() + within_s
        waiting = list(workers)
        while waiting and time.monotonic() < deadline:
            waiting = [w for w in waiting if not w.ready() and not w.failed_start() and w.process.poll() is None]
            time.sleep(0.1)
        return [w for w in workers if not w.ready()]

    def rows(self) -> list[Row]:
        """The fleet's ids in the state table (read-only). Without lease columns (a release before leases), every
        id named ``<prefix>-<n>``, holder unknown."""
        connection = self.db.connect()
        try:
            try:
                from kafka2pc.dualwrite.connection import adapt  # noqa: PLC0415
                from kafka2pc.dualwrite.leases import LeaseTable  # noqa: PLC0415
                from kafka2pc.dualwrite.state_table import StateTable  # noqa: PLC0415
            except ImportError:
                cursor = connection.cursor()
                cursor.execute(self.db.sql(f"SELECT transactional_id FROM {STATE_TABLE} WHERE transactional_id >= ? "
                                           "AND transactional_id < ? ORDER BY transactional_id"),
                               (f"{self.prefix}-", f"{self.prefix}."))
                return [Row(row[0], None, "unleased") for row in cursor.fetchall()]
            table = LeaseTable(StateTable(adapt(connection), STATE_TABLE, create=False), self.prefix)
            return [Row(r.transactional_id, r.holder, r.status) for r in table.rows()]
        finally:
            connection.close()

    def ids_of(self, workers: list[Worker]) -> list[str]:
        """The ids the workers hold (rows naming them as holder); every id of the fleet where rows name no holder."""
        rows = self.rows()
        if all(row.holder is None and row.status == "unleased" for row in rows):
            return [row.transactional_id for row in rows]
        holders = {w.holder for w in workers}
        return [row.transactional_id for row in rows if row.holder in holders]

    def open_transactions(self, ids: list[str], states: tuple[str, ...] = OPEN_STATES) -> dict[str, tuple[int, int]]:
        """Of ``ids``, those with a transaction open in Kafka now (in one of ``states``): id -> (producer id,
        epoch)."""
        if not ids:
            return {}
        found: dict[str, tuple[int, int]] = {}
        for transactional_id, answer in zip(ids, self.control.describe_all(ids), strict=True):
            seen = self.control.describe(transactional_id) if isinstance(answer, Exception) else answer  # once more
            if isinstance(seen, ObservedTransaction) and seen.state in states:
                found[transactional_id] = (seen.producer_id, seen.epoch)
        return found

    def still_open(self, pinned: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
        """Of the ``pinned`` transactions, those still open (the same producer id and epoch, in an open state)."""
        ids = sorted(pinned)
        if not ids:
            return {}
        left = {}
        for transactional_id, seen in zip(ids, self.control.describe_all(ids), strict=True):
            if isinstance(seen, Exception) or (isinstance(seen, ObservedTransaction) and seen.state in OPEN_STATES
                                               and (seen.producer_id, seen.epoch) == pinned[transactional_id]):
                left[transactional_id] = pinned[transactional_id]
        return left

    def wait_unpinned(self, death: Death, within_s: float = UNPIN_WITHIN_S + 5) -> Death:
        while time.monotonic() - death.at < within_s:
            if not self.still_open(death.pinned):
                death.unpinned_s = round(time.monotonic() - death.at, 2)
                break
            time.sleep(0.25)
        return death

    def close(self) -> None:
        for worker in self.workers:
            if worker.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.process.send_signal(signal.SIGCONT)
                    worker.process.kill()
                worker.process.wait(timeout=30)


@pytest.fixture
def control(kafka) -> Iterator[TransactionControl]:
    with ClusterClient(ClientConfig.for_bootstrap(kafka.bootstrap_servers)) as client:
        yield TransactionControl(client, timeout_s=10)


class Scenario:
    """The five phases, on a fleet, with what each measured."""

    def __init__(self, fleet: Fleet, rng: random.Random):
        self.fleet, self.rng = fleet, rng
        self.deaths: list[Death] = []
        self.not_ready: list[Worker] = []
        self.notes: dict[str, Any] = {}
        self.leased_peak = 0

    def sample(self) -> None:
        self.leased_peak = max(self.leased_peak, sum(row.status == "leased" for row in self.fleet.rows()))

    def kill(self, victims: list[Worker], what: str) -> Worker:
        """SIGKILL ``victims`` (once one of them has a transaction in progress, within 3 s), start a replacement at
        once, note the transactions open on their ids, and wait until those ended."""
        fleet = self.fleet
        deadline, seen = time.monotonic() + 3, {}
        while time.monotonic() < deadline and not seen:
            seen = fleet.open_transactions(fleet.ids_of(victims), states=(ONGOING,))
        for victim in victims:
            victim.process.kill()
        at = time.monotonic()
        for victim in victims:
            victim.process.wait(timeout=30)
        successor = fleet.start()
        death = Death(what, at, fleet.open_transactions(fleet.ids_of(victims)), seen=seen)
        self.deaths.append(death)
        self.not_ready += fleet.wait_ready([successor])
        fleet.wait_unpinned(death)
        return successor

    def steady(self) -> list[Worker]:
        originals = [self.fleet.start() for _ in range(WORKERS)]
        self.not_ready += self.fleet.wait_ready(originals)
        time.sleep(STEADY_S)
        self.sample()
        return originals

    def kill_one(self, originals: list[Worker]) -> None:
        time.sleep(self.rng.uniform(0.0, 1.5))
        victim = self.rng.choice(originals)
        victim.role = "killed"
        self.kill([victim], "kill")

    def pause_one(self) -> None:
        fleet = self.fleet
        paused = self.rng.choice([w for w in fleet.alive() if w.role == "healthy"])
        paused.role = "paused"
        held = fleet.ids_of([paused])
        paused.process.send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        pause = Death("pause", stopped_at, fleet.open_transactions(held))
        served = len(paused.tally().ok)  # frozen now: its record does not grow until SIGCONT
        fleet.wait_unpinned(pause, within_s=LEASE_S + 5)
        time.sleep(max(0.0, stopped_at + LEASE_S + 5 - time.monotonic()))
        self.sample()
        lost = [row.transactional_id for row in fleet.rows() if row.transactional_id in held
                and row.holder != paused.holder]
        paused.process.send_signal(signal.SIGCONT)
        resumed_at, again = time.monotonic(), None
        while time.monotonic() - resumed_at < 30 and paused.process.poll() is None:
            if paused.served_since(served + THREADS):  # more than the requests frozen mid-way: one begun after
                again = round(time.monotonic() - resumed_at, 2)
                break
            time.sleep(0.1)
        held_again = len(fleet.ids_of([paused]))
        while_paused = pause.unpinned_s
        if while_paused is None:  # its transactions still open at SIGCONT: when do they end?
            fleet.wait_unpinned(pause, within_s=LEASE_S + 5 + UNPIN_WITHIN_S)
        self.notes["pause"] = {"open then": len(pause.pinned), "ended while paused (s)": while_paused,
                               "ended (s)": pause.unpinned_s, "ids lost": f"{len(lost)}/{len(held)}",
                               "served again after (s)": again, "ids held then": held_again}

    def stop_one(self) -> None:
        fleet = self.fleet
        leaving = self.rng.choice([w for w in fleet.alive() if w.role == "healthy"])
        leaving.role = "stopped"
        held = fleet.ids_of([leaving])
        leaving.process.send_signal(signal.SIGTERM)
        stop = Death("stop", time.monotonic(), fleet.open_transactions(held))
        with contextlib.suppress(subprocess.TimeoutExpired):
            leaving.process.wait(timeout=30)
        self.notes["stop closed its pool"] = "closed" in leaving.lines()
        # an id it kept (its transaction not settled at close) is still its: what is open on it pins consumers too
        stop.pinned.update(fleet.open_transactions(fleet.ids_of([leaving])))
        self.deaths.append(fleet.wait_unpinned(stop))

    def kill_all(self) -> Worker:
        fleet = self.fleet
        time.sleep(self.rng.uniform(0.5, 1.5))
        everyone = fleet.alive()
        last = self.kill(everyone, f"fleet of {len(everyone)}")
        dead = {w.holder for w in everyone}
        settled = None
        while time.monotonic() - self.deaths[-1].at < UNPIN_WITHIN_S + 5:
            if not any(row.holder in dead or row.status == "expired" for row in fleet.rows()):
                settled = round(time.monotonic() - self.deaths[-1].at, 2)
                break
            time.sleep(0.25)
        self.notes["fleet settled (s)"] = settled
        if settled is None and last.process.poll() is None:
            last.process.send_signal(signal.SIGUSR1)  # its threads' stacks, into its stderr
            time.sleep(0.5)
        return last

    def stop_last(self, last: Worker) -> None:
        served, deadline = len(last.tally().ok), time.monotonic() + 10
        while time.monotonic() < deadline and len(last.tally().ok) < served + 20:
            time.sleep(0.1)
        last.process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            last.process.wait(timeout=30)
        self.notes["last closed its pool"] = "closed" in last.lines()


@pytest.mark.timeout(420)  # about 45 s when it passes; every wait is bounded
# SQLite in make chaos (the suite's time budget): the pool's SQLite paths are the model tests'
@pytest.mark.parametrize("database", [pytest.param("sqlite", marks=pytest.mark.slow), "postgres"], indirect=True)
def test_a_fleet_with_one_config_survives_kills_pauses_and_scale_down(database, kafka, topic_factory, control,
                                                                      tmp_path):
    began = time.monotonic()
    topic = topic_factory(kafka, partitions=3)
    fleet = Fleet(database, kafka.bootstrap_servers, topic, tmp_path, control)
    run = Scenario(fleet, random.Random(SEED))
    try:
        originals = run.steady()  # 1.
        run.kill_one(originals)  # 2.
        run.pause_one()  # 3.
        run.stop_one()  # 4.
        run.stop_last(run.kill_all())  # 5.
    finally:
        fleet.close()
    check(fleet, run, database, kafka_keys(kafka.bootstrap_servers, topic), time.monotonic() - began)


def check(fleet: Fleet, run: Scenario, db: Database, keys: list[int], wall_s: float) -> None:
    """The figures, printed on one line, then asserted."""
    rows, db_ids = fleet.rows(), db.ids()
    still_open = fleet.open_transactions([row.transactional_id for row in rows])
    tallies = {w.launch: w.tally() for w in fleet.workers}
    acknowledged = set().union(*(t.ok for t in tallies.values()))
    decided = set().union(*(t.decided for t in tallies.values()))
    healthy = [tallies[w.launch] for w in fleet.workers if w.role == "healthy"]
    healthy_requests = sum(t.requests for t in healthy)
    healthy_failed = sum(sum(t.failed.values()) for t in healthy)
    healthy_rate = healthy_failed / max(1, healthy_requests)
    failures = Counter[str]()
    for tally in tallies.values():
        failures.update(tally.failed)
    missing = sorted((acknowledged | decided) - set(db_ids))
    duplicates = len(keys) - len(set(keys))
    workers = " ".join(f"w{w.launch}({w.role}):{len(tallies[w.launch].ok)}ok/{sum(tallies[w.launch].failed.values())}"
                       "fail" for w in fleet.workers)
    print(f"\nFLEET {'sqlite' if db.placeholder == '?' else 'postgres'} ({kafka2pc.__file__}) seed={SEED} "
          f"lease_s={LEASE_S:g}: unpinned "
          + ", ".join(f"{d.what} {d.unpinned_s} s ({len(d.pinned)} open, {len(d.seen)} just before)"
                      for d in run.deaths)
          + f"; pause {run.notes.get('pause')}; fleet settled {run.notes.get('fleet settled (s)')} s; healthy "
          f"failures {healthy_failed}/{healthy_requests} = {100 * healthy_rate:.2f} %; ids {len(rows)} vs peak "
          f"writers {fleet.peak_writers} (leased at once <= {run.leased_peak}); acknowledged {len(acknowledged)}, "
          f"decided {len(decided)}, failed {dict(failures)}; DB {len(db_ids)} rows, Kafka {len(keys)} keys, "
          f"duplicates {duplicates}, acknowledged missing {len(missing)}; rows "
          f"{dict(Counter(row.status for row in rows))}, still open {len(still_open)}; {workers}; {wall_s:.0f} s")

    def logs() -> str:
        return "\n".join(f"--- worker {w.launch} ({w.role}) stderr:\n{w.stderr_tail()}" for w in fleet.workers)

    assert not run.not_ready, f"not ready: {[(w.launch, w.failed_start()) for w in run.not_ready]}\n{logs()}"
    assert not missing, f"{len(missing)} acknowledged orders not in the database, e.g. {missing[:10]}"
    assert duplicates == 0, f"{duplicates} duplicate keys in Kafka"
    assert db_ids == keys, f"DB ids != read_committed keys: only in DB {sorted(set(db_ids) - set(keys))[:10]}, " \
                           f"only in Kafka {sorted(set(keys) - set(db_ids))[:10]}"
    for death in run.deaths:
        assert death.unpinned_s is not None and death.unpinned_s <= UNPIN_WITHIN_S, \
            f"{death.what}: transactions {death.pinned} not all ended within {UNPIN_WITHIN_S:g} s\n{logs()}"
    assert healthy_rate <= HEALTHY_FAILURES_AT_MOST, \
        f"healthy processes failed {healthy_failed} of {healthy_requests} requests ({dict(failures)})\n{logs()}"
    assert any(death.pinned for death in run.deaths if death.what != "stop"), "no kill caught a transaction open"
    assert run.notes["pause"]["served again after (s)"] is not None, f"the paused process stopped serving\n{logs()}"
    if db.placeholder != "?":  # PostgreSQL ends a frozen process's transaction after a lease; SQLite cannot (docs)
        ended = run.notes["pause"]["ended (s)"]
        assert ended is not None and ended <= UNPIN_WITHIN_S, f"the paused process's transactions: {run.notes}"
    assert run.notes["stop closed its pool"] and run.notes["last closed its pool"], f"a stop failed\n{logs()}"
    assert run.notes["fleet settled (s)"] is not None, f"the last process did not settle the fleet: {rows}\n{logs()}"
    assert len(rows) <= 2 * fleet.peak_writers, [row.transactional_id for row in rows]
    assert not still_open, still_open
    assert all(row.status in ("free", "unleased") for row in rows), rows
