"""kafka2pc's metrics, in Prometheus' data model (``prometheus_client``'s default registry).

Serve them with ``prometheus_client.start_http_server(port)``, or read them with :func:`render` /
:func:`sample`. Names start with ``kafka2pc_``.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, Counter, Gauge, generate_latest

TRANSACTIONS_ENDED = Counter(
    "kafka2pc_transactions_ended", "Transactions ended by kafka2pc producers and committers, by outcome",
    ["outcome"])
TWO_PHASE_FALLBACKS = Counter(
    "kafka2pc_two_phase_commit_fallbacks",
    "Producers asked for two-phase commit that fell back to standard transactions (broker without Enable2Pc)")
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


def render() -> bytes:
    """Every metric of the default registry in Prometheus' text format."""
    return generate_latest(REGISTRY)


def sample(name: str, **labels: str) -> float | None:
    """The current value of one sample (``name`` as exposed, e.g. ``kafka2pc_transactions_ended_total``)."""
    value = REGISTRY.get_sample_value(name, labels)
    return None if value is None else float(value)
