"""``kafka2pc audit``: did every id arrive exactly once? Duplicates, gaps, unreadable records and open transactions
that pin a topic's last stable offset.

Two parts: :func:`compute_report` (and the :class:`Tally` under it) turns ``(partition, offset, id-or-None)``
entries and the partitions' end offsets into an :class:`AuditReport`, without a broker; :func:`audit_topic` reads a
topic as a read_committed confluent-kafka consumer (librdkafka, an independent client) and asks the partition
leaders which producers hold the LSO back.
"""

from __future__ import annotations

from kafka2pc.audit.decoding import RecordDecoder
from kafka2pc.audit.open_transactions import describe_open_transactions
from kafka2pc.audit.reader import EndOffsets, audit_topic, librdkafka_config
from kafka2pc.audit.report import (
    AuditReport,
    DuplicateExample,
    GapRange,
    GroupReport,
    OpenTransaction,
    PinnedPartition,
    RecordRef,
)
from kafka2pc.audit.tally import Entry, Tally, compute_report
from kafka2pc.errors import AuditError

__all__ = ["AuditError", "AuditReport", "DuplicateExample", "EndOffsets", "Entry", "GapRange", "GroupReport",
           "OpenTransaction", "PinnedPartition", "RecordDecoder", "RecordRef", "Tally", "audit_topic",
           "compute_report", "describe_open_transactions", "librdkafka_config"]
