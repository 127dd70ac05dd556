"""kafka2pc's metrics, in Prometheus' data model (``prometheus_client``'s default registry).

Serve them with ``prometheus_client.start_http_server(port)``, or read them with :func:`render` /
:func:`sample`. Names start with ``kafka2pc_``. docs/operations.md says what each one covers, and ``ops/`` has alert
rules and a dashboard built on them.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextvars import ContextVar

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, generate_latest

#: the ``path`` label: who ran a phase. ``producer`` is a TwoPhaseProducer used directly (the sink's tasks prepare
#: through one too); ``sink`` the sink's committer and recovery; ``dual_write`` a DualWriter (and its pool)
PRODUCER, SINK, DUAL_WRITE = "producer", "sink", "dual_write"
#: the ``reason`` label of transactions settled by recovery
COMMITTED_DECIDED, ABORTED_UNDECIDED = "committed_decided", "aborted_undecided"
#: the ``reason`` label of fallbacks: InitProducerId v6 not advertised; the broker's
#: transaction.two.phase.commit.enable=false; Enable2Pc refused and the config unreadable (the principal may lack
#: TWO_PHASE_COMMIT); v6 gone under a running client; a Spark batch whose tasks fell back (counted by the driver);
#: a reason this release does not know
FALLBACK_REASONS = ("no_v6", "config_off", "acl", "turned_off", "sink_batch", "other")
#: the ``outcome`` label of ended transactions: a TwoPhaseProducer's commit or abort, and a sink committer's
#: completion (lost: a decided transaction that can never commit; unknown: its fate cannot be read)
OUTCOMES = ("committed", "aborted", "lost", "unknown")
#: the phases' latency buckets (seconds): a millisecond to five minutes
PHASE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
                 300.0)

TRANSACTIONS_ENDED = Counter(
    "kafka2pc_transactions_ended", "Transactions ended by kafka2pc producers and committers, by outcome",
    ["outcome"])
TWO_PHASE_FALLBACKS = Counter(
    "kafka2pc_two_phase_commit_fallbacks",
    "Producers asked for two-phase commit that fell back to standard transactions, by reason (no_v6, config_off, "
    "acl, turned_off; sink_batch: a Spark batch whose tasks fell back)", ["reason"])
PREPARE_SECONDS = Histogram(
    "kafka2pc_prepare_seconds", "Preparing a transaction (flushing its records, then the vote), by who asked",
    ["path"], buckets=PHASE_BUCKETS)
RECORD_DECISION_SECONDS = Histogram(
    "kafka2pc_record_decision_seconds",
    "Recording the commit decision (the commit point): the sink's decision log write, the dual writer's database "
    "commit", ["path"], buckets=PHASE_BUCKETS)
COMPLETE_SECONDS = Histogram(
    "kafka2pc_complete_seconds",
    "Completing transactions: a producer's commit or abort, the sink committer's completion of a decision (all its "
    "transactions), the dual writer's Kafka completion after its database commit", ["path"], buckets=PHASE_BUCKETS)
RECOVERY_RUN_SECONDS = Histogram(
    "kafka2pc_recovery_seconds",
    "One recovery run: the sink's recovery of a prefix, a dual writer's recovery of its id", ["path"],
    buckets=PHASE_BUCKETS)
OLDEST_OPEN_TRANSACTION = Gauge(
    "kafka2pc_oldest_open_transaction_seconds",
    "Age of the oldest open or prepared transaction under a prefix that this process knows of (its own, and those "
    "its recoveries found and have not settled; 0: none): it holds back read_committed consumers of its partitions",
    ["prefix"], multiprocess_mode="livemax")
RECOVERY_SETTLED = Counter(
    "kafka2pc_recovery_settled_transactions",
    "Transactions recovery settled, by reason: committed_decided (decided, so committed), aborted_undecided "
    "(never decided, so aborted)", ["prefix", "path", "reason"])
LIVE_IDS = Gauge(
    "kafka2pc_sink_live_transactional_ids", "Transactional ids in use (open or prepared) by a sink subtask",
    ["prefix", "subtask"])
LIVE_IDS_MAX = Gauge(
    "kafka2pc_sink_live_transactional_ids_max", "The cap on live transactional ids of a sink subtask",
    ["prefix", "subtask"])
ID_POOL_EXHAUSTED = Counter(
    "kafka2pc_sink_id_pool_exhausted", "Times a sink subtask needed more live transactional ids than its cap",
    ["prefix", "subtask"])
RECOVERY_ROLLED_FORWARD = Counter(
    "kafka2pc_recovery_rolled_forward_transactions", "Decided transactions committed by recovery", ["prefix"])
RECOVERY_ABORTED = Counter(
    "kafka2pc_recovery_aborted_transactions", "Lingering transactions aborted by recovery", ["prefix"])
RECOVERY_SECONDS = Gauge(
    "kafka2pc_recovery_last_duration_seconds", "How long the last recovery of a prefix took", ["prefix"])
PRODUCER_CACHE_LOOKUPS = Counter(
    "kafka2pc_producer_cache_lookups",
    "Tasks looking for a cached producer of their transactional id: continued (no InitProducerId), superseded "
    "(the id moved on: a new producer took it over), absent", ["result"])
# the multiprocess modes (prometheus_client's multiprocess collector: gunicorn and Celery workers) count only live
# processes, so a dead worker's last value never keeps an alert firing
DUAL_WRITE_LEASED_IDS = Gauge(
    "kafka2pc_dual_write_leased_ids", "Transactional ids a DualWriterPool holds leases on", ["prefix"],
    multiprocess_mode="livesum")
DUAL_WRITE_EXPIRED_LEASES = Gauge(
    "kafka2pc_dual_write_expired_leases",
    "Expired leases of the fleet waiting for a live pool to settle them, as a pool's keeper last saw them",
    ["prefix"], multiprocess_mode="livemax")
DUAL_WRITE_OLDEST_EXPIRED_LEASE = Gauge(
    "kafka2pc_dual_write_oldest_expired_lease_seconds",
    "How long the fleet's oldest expired lease has waited to be settled (0: none), as a pool's keeper last saw it",
    ["prefix"], multiprocess_mode="livemax")
DUAL_WRITE_OLDEST_OPEN_TRANSACTION = Gauge(
    "kafka2pc_dual_write_oldest_open_transaction_seconds",
    "Age of the oldest dual-write transaction a pool has open (in a block, or left unfinished until settled): "
    "a prepared one holds back read_committed consumers of its partitions", ["prefix"], multiprocess_mode="livemax")
DUAL_WRITE_KEEPER_ERRORS = Counter(
    "kafka2pc_dual_write_keeper_errors", "Rounds of a pool's lease keeper that failed (the database or Kafka away)",
    ["prefix"])
DUAL_WRITE_LEASES_TAKEN_OVER = Counter(
    "kafka2pc_dual_write_leases_taken_over", "Expired leases of other processes a pool claimed and settled",
    ["prefix"])

# the series of bounded labels exist from import, at 0, so that increase() over a window sees their first event
# (a series born at 1 has no earlier sample). Under the multiprocess mode this writes this process's file at import:
# a PROMETHEUS_MULTIPROC_DIR that does not exist leaves them out (the first event then fails), never fails the import
def _series_at_zero() -> None:
    try:
        for outcome in OUTCOMES:
            TRANSACTIONS_ENDED.labels(outcome=outcome)
        for reason in FALLBACK_REASONS:
            TWO_PHASE_FALLBACKS.labels(reason=reason)
    except OSError:  # PROMETHEUS_MULTIPROC_DIR missing: the first event fails instead, never the import (the CLI)
        pass


_series_at_zero()

_PRODUCER_PATH: ContextVar[str] = ContextVar("kafka2pc_metrics_path", default=PRODUCER)


@contextlib.contextmanager
def on_behalf_of(path: str) -> Iterator[None]:
    """Within the block, a TwoPhaseProducer's phases are labelled ``path`` (an engine driving its producer): each
    phase is counted once, under whoever asked for it."""
    token = _PRODUCER_PATH.set(path)
    try:
        yield
    finally:
        _PRODUCER_PATH.reset(token)


def producer_path() -> str:
    """The ``path`` label of a TwoPhaseProducer's phase now (see :func:`on_behalf_of`)."""
    return _PRODUCER_PATH.get()


def fallback_reason(reason: str) -> str:
    """The bounded ``reason`` label of a fallback, from the reason the producer's initialisation gave."""
    if "no longer advertises" in reason:
        return "turned_off"
    if "TRANSACTIONAL_ID_AUTHORIZATION_FAILED" in reason:  # refused, and the broker's config could not be read
        return "acl"
    if "commit.enable=false" in reason:
        return "config_off"
    if "advertises InitProducerId up to" in reason:
        return "no_v6"
    return "other"


_SINK_ID = re.compile(r"(.+)-(?:0|[1-9][0-9]{0,9})-(?:0|[1-9][0-9]{0,9})")


def sink_prefix(transactional_id: str) -> str | None:
    """The prefix of a sink id ``<prefix>-<subtask>-<counter>``; None for any other id."""
    match = _SINK_ID.fullmatch(transactional_id)
    return None if match is None else match.group(1)


class OpenTransactions:
    """The transactions this process knows to be open or prepared, by prefix and path, since when (wall clock, as
    the brokers' DescribeTransactions start times are): what :data:`OLDEST_OPEN_TRANSACTION` shows. Thread-safe.

    The value is computed when the gauge is read; under prometheus_client's multiprocess mode (which reads what
    processes wrote) it is written at every change and by :meth:`refresh` (a DualWriterPool's keeper, every round).
    """

    def __init__(self, gauge: Gauge, clock: Callable[[], float] = time.time):
        self._gauge = gauge
        self._clock = clock
        self._lock = threading.Lock()
        self._open: dict[tuple[str, str], dict[str, float]] = {}
        self._prefixes: set[str] = set()

    def opened(self, prefix: str, path: str, transactional_id: str, since: float | None = None) -> None:
        """A transaction of this process opened on ``transactional_id`` (now, or at ``since``)."""
        with self._lock:
            self._open.setdefault((prefix, path), {})[transactional_id] = self._clock() if since is None else since
        self._changed(prefix)

    def found(self, prefix: str, path: str, transactional_id: str, since: Callable[[], float | None]) -> None:
        """An open transaction on ``transactional_id`` this process now answers for (offered to its committer, or
        found by its recovery); ``since`` (called only when it is not known yet) gives its start, None: now."""
        with self._lock:
            if transactional_id in self._open.get((prefix, path), {}):
                return
        started = since()
        with self._lock:
            self._open.setdefault((prefix, path), {}).setdefault(
                transactional_id, self._clock() if started is None else started)
        self._changed(prefix)

    def closed(self, prefix: str, path: str, transactional_id: str) -> None:
        """The transaction on ``transactional_id`` ended (or is no longer this process's to know)."""
        with self._lock:
            known = self._open.get((prefix, path), {}).pop(transactional_id, None)
        if known is not None:
            self._changed(prefix)

    def retain(self, prefix: str, path: str, transactional_ids: Collection[str]) -> None:
        """A listing showed that of ``prefix``'s ids on ``path``, ``transactional_ids`` are the open ones this
        process answers for: forget every other, and count those not known yet from now."""
        now = self._clock()
        with self._lock:
            known = self._open.setdefault((prefix, path), {})
            for gone in set(known) - set(transactional_ids):
                del known[gone]
            for txn_id in transactional_ids:
                known.setdefault(txn_id, now)
        self._changed(prefix)

    def oldest(self, prefix: str) -> float:
        """Seconds since the oldest transaction of ``prefix`` this process knows of opened; 0 when there is none."""
        now = self._clock()
        with self._lock:
            starts = [since for (known_prefix, _), ids in self._open.items() if known_prefix == prefix
                      for since in ids.values()]
        return max((max(0.0, now - since) for since in starts), default=0.0)

    def refresh(self) -> None:
        """Write the current ages (for prometheus_client's multiprocess mode, which reads what was written)."""
        with self._lock:
            prefixes = list(self._prefixes)
        for prefix in prefixes:
            self._gauge.labels(prefix=prefix).set(self.oldest(prefix))

    def _changed(self, prefix: str) -> None:
        child = self._gauge.labels(prefix=prefix)
        with self._lock:
            new = prefix not in self._prefixes
            self._prefixes.add(prefix)
        if new:
            child.set_function(lambda: self.oldest(prefix))
        child.set(self.oldest(prefix))


#: this process's open transactions, behind :data:`OLDEST_OPEN_TRANSACTION`
OPEN_TRANSACTIONS = OpenTransactions(OLDEST_OPEN_TRANSACTION)


def render() -> bytes:
    """Every metric of the default registry in Prometheus' text format."""
    return generate_latest(REGISTRY)


def sample(name: str, **labels: str) -> float | None:
    """The current value of one sample (``name`` as exposed, e.g. ``kafka2pc_transactions_ended_total``)."""
    value = REGISTRY.get_sample_value(name, labels)
    return None if value is None else float(value)
