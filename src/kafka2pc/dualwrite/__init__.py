"""Coordinated DB + Kafka dual write: ``DualWriter(connection, config)``; docs/dual-write.md."""

from kafka2pc.dualwrite.writer import DualWriter, DualWriteTransaction
from kafka2pc.errors import DualWriteIncompleteError, DualWriteOutcomeUnknownError, DualWriteRecoveryError

__all__ = ["DualWriteIncompleteError", "DualWriteOutcomeUnknownError", "DualWriteRecoveryError", "DualWriteTransaction",
           "DualWriter"]
