"""The engine-neutral sink core: pooled transactional ids, the writer/committer cycle, the decision log and
recovery (FLIP-511's design, for kafka2pc). The Spark sink and the DB dual-writer sit on it."""

from __future__ import annotations

from kafka2pc.sink.committer import Committer
from kafka2pc.sink.decision_log import (
    Decision,
    DecisionConflictError,
    DecisionLog,
    DecisionLogCorruptError,
    FileDecisionLog,
)
from kafka2pc.sink.id_pool import IdPoolExhaustedError, TransactionalIdPool
from kafka2pc.sink.naming import TransactionalIdGrammar, TransactionNamingStrategy
from kafka2pc.sink.prepared import PreparedTransaction
from kafka2pc.sink.recovery import RecoveryIncompleteError, RecoveryReport, abort_lingering, recover
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
    "SubtaskWriter",
    "TransactionNamingStrategy",
    "TransactionalIdGrammar",
    "TransactionalIdPool",
    "abort_lingering",
    "recover",
]
