"""Connected clients and handed-over producers that one process keeps between the tasks it runs.

The counterpart of Spark's ``CachedKafkaProducer`` (one producer per executor and configuration, closed after
``spark.kafka.producer.cache.timeout`` idle). A task whose transactional id's producer is here goes on without a new
connection, and — transaction protocol v2 — without an InitProducerId: the producer prepared the id's last
transaction, a committer ended it (which bumped the epoch), and the producer takes that epoch
(:meth:`~kafka2pc.TwoPhaseProducer.continue_after_completion`). When the id shows anything else, the cached producer
is dropped and the task takes the id over with a new one, which fences every earlier producer.

A producer that asked for two-phase commit and fell back (brokers without it) is not kept: each task's new
producer decides again (:class:`~kafka2pc._core.initialization.Initialization`, which reads the brokers' ApiVersions
again when the ones it has are older than ``VERSIONS_MAX_AGE_S``), so a cluster that gains it is used within that
time. A producer that uses it goes on only while its decision stands (``DECISION_STANDS_S``,
:func:`~kafka2pc._core.initialization.decision_stands`): then a new one initialises, so a cluster that turned it
off is followed too, instead of cached producers going on with transactions that never time out.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import attrs

from kafka2pc import metrics
from kafka2pc.cluster import ClusterClient
from kafka2pc.config import ClientConfig
from kafka2pc.config.keys import PRODUCER_KEYS
from kafka2pc.config.producer import max_block_ms
from kafka2pc.config.redaction import reveal
from kafka2pc.producer import DECISION_STANDS_S, VERSIONS_MAX_AGE_S, State, TwoPhaseProducer, decision_stands
from kafka2pc.transaction_control import ObservedTransaction, TransactionControl

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Spark's default for ``spark.kafka.producer.cache.timeout``
DEFAULT_IDLE_TIMEOUT_S = 600.0
ConfigKey = tuple[tuple[str, str], ...]


def config_key(config: Mapping[str, Any]) -> ConfigKey:
    """The cache key of a client configuration (values as text; held in memory only, never shown)."""
    return tuple(sorted((str(k), str(reveal(v))) for k, v in config.items()))


@attrs.define
class _Entry(Generic[T]):
    value: T
    last_used: float


class ProducerCache:
    """Clients keyed by configuration, and producers whose prepared transaction was handed over, keyed by
    configuration and transactional id. Anything unused for ``idle_timeout_s`` is closed at the next access;
    ``idle_timeout_s=0`` keeps no producers (clients are still shared). One thread at a time, like the producers."""

    def __init__(self, *, idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
                 clock: Callable[[], float] = time.monotonic):
        self.idle_timeout_s = idle_timeout_s
        self._clock = clock
        self._clients: dict[ConfigKey, _Entry[ClusterClient]] = {}
        #: one per client, and when it was made (``last_used`` here): what it learnt of the cluster (its
        #: transaction protocol) outlives a task or a commit, not VERSIONS_MAX_AGE_S
        self._controls: dict[ConfigKey, _Entry[TransactionControl]] = {}
        self._producers: dict[tuple[ConfigKey, str, bool], _Entry[TwoPhaseProducer]] = {}
        #: when each producer handed out or kept decided on two-phase commit (its init_transactions, or before)
        self._decided_at: weakref.WeakKeyDictionary[TwoPhaseProducer, float] = weakref.WeakKeyDictionary()

    def client(self, config: Mapping[str, Any]) -> ClusterClient:
        """The process's client for a cluster configuration (connected on first use)."""
        key, now = config_key(config), self._clock()
        entry = self._clients.get(key)
        if entry is None:
            self.evict_idle()
            client = ClusterClient(ClientConfig.from_dict(dict(config), consumed_elsewhere=PRODUCER_KEYS),
                                   bootstrap_timeout_s=max_block_ms(config) / 1000)
            entry = self._clients[key] = _Entry(client, now)
        entry.last_used = now
        return entry.value

    def control(self, config: Mapping[str, Any]) -> TransactionControl:
        """Coordinator operations over :meth:`client`'s client, kept with it for up to ``VERSIONS_MAX_AGE_S``: what
        it learnt of the cluster (its transaction protocol) is read again after that, whichever way it changed."""
        client, now = self.client(config), self._clock()
        key = config_key(config)
        kept = self._controls.get(key)
        if kept is None or now - kept.last_used > VERSIONS_MAX_AGE_S:
            kept = self._controls[key] = _Entry(TransactionControl(client), now)
        return kept.value

    def take(self, config: Mapping[str, Any], transactional_id: str, observed: ObservedTransaction | None, *,
             two_phase_commit: bool) -> TwoPhaseProducer | None:
        """The cached producer of ``transactional_id``, READY to begin without an InitProducerId, when ``observed``
        (the id's look, taken now) lets it go on; None otherwise (a cached one that may not is closed)."""
        key = config_key(config)
        entry = self._producers.pop((key, transactional_id, two_phase_commit), None)
        client_entry = self._clients.get(key)
        if client_entry is not None:  # the caller is using it: never closed as idle under its look
            client_entry.last_used = self._clock()
        self.evict_idle()
        if entry is None:
            metrics.PRODUCER_CACHE_LOOKUPS.labels(result="absent").inc()
            return None
        producer = entry.value
        if two_phase_commit and not decision_stands(self._decided_at.get(producer), self._clock()):
            log.info("cached producer of %r decided on two-phase commit more than %g s ago: a new one initialises, "
                     "following the cluster's setting", transactional_id, DECISION_STANDS_S)
            metrics.PRODUCER_CACHE_LOOKUPS.labels(result="superseded").inc()
            producer.close()
            return None
        if producer.continue_after_completion(observed):
            metrics.PRODUCER_CACHE_LOOKUPS.labels(result="continued").inc()
            return producer
        log.info("cached producer of %r does not go on (the id shows %s): a new one takes the id over",
                 transactional_id, observed)
        metrics.PRODUCER_CACHE_LOOKUPS.labels(result="superseded").inc()
        producer.close()
        return None

    def keep(self, config: Mapping[str, Any], producer: TwoPhaseProducer, *, two_phase_commit: bool) -> None:
        """Keep ``producer``, whose prepared transaction was handed over to a committer, for the next task on its
        id; a producer in any other state, one that fell back from two-phase commit, or any with caching off, is
        closed."""
        fell_back = two_phase_commit and not producer.two_phase_commit_active
        if self.idle_timeout_s <= 0 or producer.state is not State.PREPARED or fell_back:
            producer.close()
            return
        key = (config_key(config), producer.transactional_id, two_phase_commit)
        previous = self._producers.pop(key, None)
        if previous is not None:
            previous.value.close()
        now = self._clock()
        self._decided_at.setdefault(producer, now)  # a new one decided during its task; one gone on keeps its time
        self._producers[key] = _Entry(producer, now)
        self.evict_idle()

    def evict_idle(self) -> None:
        """Close what was unused for longer than the idle timeout (a client only once no cached producer uses it)."""
        now = self._clock()
        for key, entry in list(self._producers.items()):
            if now - entry.last_used > self.idle_timeout_s:
                del self._producers[key]
                entry.value.close()
        in_use = {config for config, _, _ in self._producers}
        client_timeout = self.idle_timeout_s if self.idle_timeout_s > 0 else DEFAULT_IDLE_TIMEOUT_S
        for config, client_entry in list(self._clients.items()):
            if config not in in_use and now - client_entry.last_used > client_timeout:
                del self._clients[config]
                self._controls.pop(config, None)
                client_entry.value.close()

    def __len__(self) -> int:
        return len(self._producers)

    def close(self) -> None:
        """Close every cached producer and client."""
        for entry in self._producers.values():
            entry.value.close()
        for client_entry in self._clients.values():
            client_entry.value.close()
        self._producers.clear()
        self._clients.clear()
        self._controls.clear()
