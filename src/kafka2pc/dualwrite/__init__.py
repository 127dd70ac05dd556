"""Coordinated DB + Kafka dual write: ``DualWriter(connection, config)``; docs/dual-write.md."""

from kafka2pc.dualwrite.writer import (
    DualWriteIncompleteError,
    DualWriteOutcomeUnknownError,
    DualWriter,
    DualWriteRecoveryError,
    DualWriteTransaction,
)

__all__ = ["DualWriteIncompleteError", "DualWriteOutcomeUnknownError", "DualWriteRecoveryError", "DualWriteTransaction",
           "DualWriter"]
