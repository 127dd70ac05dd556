"""``kafka2pc audit``: did every id arrive exactly once? Duplicates, gaps, unreadable records and open transactions
that pin a topic's last stable offset.

The public API is :func:`audit_topic` (what ``kafka2pc audit`` runs: it reads a topic as a read_committed
confluent-kafka consumer, librdkafka being an independent client, and asks the partition leaders which producers hold
the LSO back), the :class:`RecordDecoder` it takes and the :class:`AuditReport` it returns. Under it,
:func:`kafka2pc.audit.tally.compute_report` turns ``(partition, offset, id-or-None)`` entries and the partitions' end
offsets into a report without a broker.
"""

from __future__ import annotations

from kafka2pc.audit.decoding import RecordDecoder
from kafka2pc.audit.reader import audit_topic
from kafka2pc.audit.report import (
    AuditReport,
    DuplicateExample,
    GapRange,
    GroupReport,
    OpenTransaction,
    PinnedPartition,
    RecordRef,
)
from kafka2pc.errors import AuditError

__all__ = ["AuditError", "AuditReport", "DuplicateExample", "GapRange", "GroupReport", "OpenTransaction",
           "PinnedPartition", "RecordDecoder", "RecordRef", "audit_topic"]
