"""The engine-neutral sink core: pooled transactional ids, the writer/committer cycle, the decision log and
recovery (FLIP-511's design, for kafka2pc). It runs over a :class:`~kafka2pc.TransactionControl` (a real cluster, or
the coordinator model in tests); the Spark sink sits on it.

What users of an engine's sink call or catch is exported here: :func:`abort_lingering` and the sink's errors. The
classes an engine is built from (the writer, the committer, the decision log, recovery) are the integration API,
exported by :mod:`kafka2pc.sink.integration` for someone adding an engine (docs/integration-api.md).
"""

from __future__ import annotations

import warnings
from typing import Any

from kafka2pc.errors import (
    DecisionConflictError,
    DecisionLogCorruptError,
    IdPoolExhaustedError,
    RecoveryIncompleteError,
)
from kafka2pc.sink.recovery import abort_lingering

__all__ = [
    "DecisionConflictError",
    "DecisionLogCorruptError",
    "IdPoolExhaustedError",
    "RecoveryIncompleteError",
    "abort_lingering",
]

#: names this package exported before the integration API had its own module
_MOVED = frozenset({"Committer", "Decision", "DecisionLog", "FileDecisionLog", "PreparedTransaction",
                    "RecoveryReport", "Settlement", "SubtaskWriter", "TransactionNamingStrategy",
                    "TransactionalIdGrammar", "TransactionalIdPool", "recover"})


def __getattr__(name: str) -> Any:
    """The names that moved to :mod:`kafka2pc.sink.integration`, with a DeprecationWarning."""
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"kafka2pc.sink.{name} moved to kafka2pc.sink.integration.{name}", DeprecationWarning,
                  stacklevel=2)
    from kafka2pc.sink import integration  # noqa: PLC0415 - only for the moved names

    return getattr(integration, name)
