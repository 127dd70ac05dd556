"""The writer of one subtask: an open transaction on a pooled id, prepared at each checkpoint."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from kafka2pc import metrics
from kafka2pc.cluster import ClusterClient
from kafka2pc.errors import IdPoolExhaustedError
from kafka2pc.producer import Transport, TwoPhaseProducer
from kafka2pc.sink.id_pool import DEFAULT_MAX_LIVE_IDS, TransactionalIdPool
from kafka2pc.sink.naming import TransactionNamingStrategy
from kafka2pc.sink.prepared import PreparedTransaction

log = logging.getLogger(__name__)


class SubtaskWriter:
    """Writes the records of subtask ``subtask`` in transactions on ids ``<prefix>-<subtask>-<counter>``.

    The first write after a checkpoint takes an id from the pool and opens a transaction on it;
    :meth:`prepare` votes on it and hands it over for the committer; :meth:`release` returns the ids the committer
    has completed. ``pool`` is the state to resume from (for instance the one stored with the last decision).
    ``cluster`` is the connections its producers share (or any producer transport: a coordinator model in tests).
    """

    def __init__(self, config: Mapping[str, object], prefix: str, subtask: int, *, cluster: ClusterClient | Transport,
                 pool: TransactionalIdPool | None = None,
                 strategy: TransactionNamingStrategy = TransactionNamingStrategy.POOLING,
                 two_phase_commit: bool = True, max_live_ids: int | None = None):
        if "transactional.id" in config:
            raise ValueError("transactional.id is chosen by the writer; pass prefix instead")
        self._config = dict(config)
        self._cluster = cluster
        self._two_phase_commit = two_phase_commit
        if pool is None:
            pool = TransactionalIdPool(prefix, subtask, strategy, max_live_ids or DEFAULT_MAX_LIVE_IDS)
        if (pool.prefix, pool.subtask) != (prefix, subtask):
            raise ValueError(f"pool of {pool.prefix!r}/{pool.subtask} given to writer of {prefix!r}/{subtask}")
        self.pool = pool
        self._labels = {"prefix": prefix, "subtask": str(subtask)}
        metrics.LIVE_IDS_MAX.labels(**self._labels).set(pool.max_live)
        self._track()
        self._producer: TwoPhaseProducer | None = None
        self._transactional_id: str | None = None

    @property
    def two_phase_commit_active(self) -> bool | None:
        """Whether the current transaction uses Enable2Pc (None while none is open)."""
        return None if self._producer is None else self._producer.two_phase_commit_active

    def _open(self) -> TwoPhaseProducer:
        if self._producer is not None:
            return self._producer
        try:
            self.pool, txn_id = self.pool.acquire()
        except IdPoolExhaustedError:
            metrics.ID_POOL_EXHAUSTED.labels(**self._labels).inc()
            raise
        self._track()
        producer = TwoPhaseProducer({**self._config, "transactional.id": txn_id},
                                    two_phase_commit=self._two_phase_commit, cluster=self._cluster)
        try:
            producer.init_transactions()
            producer.begin_transaction()
        except BaseException:
            producer.close()
            self.pool = self.pool.release(txn_id)
            self._track()
            raise
        self._producer, self._transactional_id = producer, txn_id
        return producer

    def write(self, topic: str, values: Sequence[bytes], keys: Sequence[bytes | None] | None = None,
              partition: int | None = None) -> None:
        """Add records to this subtask's open transaction (opening one if needed; writing nothing opens nothing)."""
        if len(values) == 0:
            return
        self._open().produce_batch(topic, values, keys, partition)

    def produce(self, topic: str, value: bytes | None, key: bytes | None = None, partition: int | None = None,
                headers: Sequence[tuple[str, bytes | None]] | None = None) -> None:
        """Add one record to this subtask's open transaction (opening one if needed)."""
        self._open().produce(topic, value, key, partition, headers)

    def prepare(self, checkpoint: int) -> PreparedTransaction | None:
        """Vote on the open transaction for ``checkpoint``; None when nothing was written since the last one (a
        writer that wrote nothing hands over nothing, and its id goes back to the pool)."""
        if self._producer is None or self._transactional_id is None:
            return None
        producer, txn_id = self._producer, self._transactional_id
        with metrics.on_behalf_of(metrics.SINK):
            state = producer.prepare_transaction()
        if state.is_empty:  # nothing reached the broker: there is no transaction to hand over
            self.abort()
            return None
        producer.close()  # the prepared transaction stays open on the broker for the committer
        self._producer = self._transactional_id = None
        return PreparedTransaction(txn_id, state, self.pool.subtask, checkpoint)

    def release(self, transactions: Sequence[PreparedTransaction]) -> None:
        """Return the ids of completed transactions to the pool."""
        for txn in transactions:
            if txn.subtask == self.pool.subtask:
                self.pool = self.pool.release(txn.transactional_id)
        self._track()

    def abort(self) -> None:
        """Abort the open transaction, if any, and free its id."""
        if self._producer is None or self._transactional_id is None:
            return
        producer, txn_id = self._producer, self._transactional_id
        self._producer = self._transactional_id = None
        try:
            producer.abort_transaction()
        finally:
            producer.close()
            self.pool = self.pool.release(txn_id)
            self._track()

    def _track(self) -> None:
        metrics.LIVE_IDS.labels(**self._labels).set(len(self.pool.in_use))

    def close(self) -> None:
        """Abort any open transaction and stop."""
        self.abort()
