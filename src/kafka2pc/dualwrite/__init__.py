"""Coordinated DB + Kafka dual write: ``DualWriter(connection, config)`` and ``DualWriterPool``, and
``AsyncDualWriter`` and ``AsyncDualWriterPool`` on asyncio; docs/dual-write.md."""

from kafka2pc.dualwrite.aio import AsyncDualWriter, AsyncDualWriteTransaction
from kafka2pc.dualwrite.aio_pool import AsyncDualWriterPool
from kafka2pc.dualwrite.pool import DualWriterPool
from kafka2pc.dualwrite.state_table import state_table_ddl, state_table_upgrade_ddl
from kafka2pc.dualwrite.writer import DualWriter, DualWriteTransaction
from kafka2pc.errors import (
    DualWriteIncompleteError,
    DualWriteOutcomeUnknownError,
    DualWriteRecoveryError,
    DualWriteUsageError,
    LeaseLostError,
    PoolTimeoutError,
)

__all__ = ["AsyncDualWriteTransaction", "AsyncDualWriter", "AsyncDualWriterPool",
           "DualWriteIncompleteError", "DualWriteOutcomeUnknownError",
           "DualWriteRecoveryError", "DualWriteTransaction", "DualWriteUsageError", "DualWriter", "DualWriterPool",
           "LeaseLostError", "PoolTimeoutError", "state_table_ddl", "state_table_upgrade_ddl"]
