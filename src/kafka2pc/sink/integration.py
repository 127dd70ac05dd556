"""The integration API: what someone adding an engine (a Flink-like runtime, a job scheduler, another streaming
framework) builds an exactly-once Kafka sink from. kafka2pc's Spark sink drives the committer, the decision log and
recovery from its driver (its tasks keep no pool: they name ids with ``TransactionNamingStrategy.attempt_counter``).

- ids: :class:`TransactionalIdGrammar` (``<prefix>-<subtask>-<counter>``), :class:`TransactionNamingStrategy`,
  :class:`TransactionalIdPool` (a frozen value to store with the engine's checkpoint);
- the cycle: a :class:`SubtaskWriter` per subtask writes, and at each checkpoint its
  :meth:`~SubtaskWriter.prepare` hands over a :class:`PreparedTransaction`; the engine hands those of a checkpoint to a
  :class:`Committer` as one :class:`Decision`, recorded in a :class:`DecisionLog` (:class:`FileDecisionLog` on a
  local or remote :class:`Folder`) before anything is committed; :class:`Settlement` says what a settle did;
- recovery: :func:`recover` before the writers start, returning a :class:`RecoveryReport`.

They run over a :class:`~kafka2pc.TransactionControl` (:mod:`kafka2pc.transaction_control` has the values it
returns) on a :class:`~kafka2pc.ClusterClient`. docs/integration-api.md says who this is for and what is stable;
docs/recovery.md describes the cycle and recovery.
"""

from __future__ import annotations

from kafka2pc.sink.committer import Committer, Settlement
from kafka2pc.sink.decision_log import Decision, DecisionLog, FileDecisionLog
from kafka2pc.sink.id_pool import TransactionalIdPool
from kafka2pc.sink.naming import TransactionalIdGrammar, TransactionNamingStrategy
from kafka2pc.sink.prepared import PreparedTransaction
from kafka2pc.sink.recovery import RecoveryReport, recover
from kafka2pc.sink.storage import Folder
from kafka2pc.sink.writer import SubtaskWriter

__all__ = [
    "Committer",
    "Decision",
    "DecisionLog",
    "FileDecisionLog",
    "Folder",
    "PreparedTransaction",
    "RecoveryReport",
    "Settlement",
    "SubtaskWriter",
    "TransactionNamingStrategy",
    "TransactionalIdGrammar",
    "TransactionalIdPool",
    "recover",
]
