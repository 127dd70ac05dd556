"""The engine-neutral sink core: pooled transactional ids, the writer/committer cycle, the decision log and
recovery (FLIP-511's design, for kafka2pc). It runs over a :class:`~kafka2pc.TransactionControl` (a real cluster, or
the coordinator model in tests); the Spark sink sits on it."""

from __future__ import annotations

from kafka2pc.errors import (
    DecisionConflictError,
    DecisionLogCorruptError,
    IdPoolExhaustedError,
    RecoveryIncompleteError,
)
from kafka2pc.sink.committer import Committer, Settlement
from kafka2pc.sink.decision_log import Decision, DecisionLog, FileDecisionLog
from kafka2pc.sink.id_pool import TransactionalIdPool
from kafka2pc.sink.naming import TransactionalIdGrammar, TransactionNamingStrategy
from kafka2pc.sink.prepared import PreparedTransaction
from kafka2pc.sink.recovery import RecoveryReport, abort_lingering, recover
from kafka2pc.sink.writer import SubtaskWriter

__all__ = [
    "Committer",
    "Decision",
    "DecisionConflictError",
    "DecisionLog",
    "DecisionLogCorruptError",
    "FileDecisionLog",
    "IdPoolExhaustedError",
    "PreparedTransaction",
    "RecoveryIncompleteError",
    "RecoveryReport",
    "Settlement",
    "SubtaskWriter",
    "TransactionNamingStrategy",
    "TransactionalIdGrammar",
    "TransactionalIdPool",
    "abort_lingering",
    "recover",
]
