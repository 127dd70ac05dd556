"""What ``kafka2pc audit`` reports: value types, JSON-ready."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs


@attrs.frozen
class RecordRef:
    """Where a record is: partition and offset (and its id, where that matters)."""

    partition: int
    offset: int
    record_id: int | None = None
    group: str | None = None

    def to_json_dict(self) -> dict[str, Any]:
        """``{"partition", "offset"}`` plus ``id`` and ``group`` when known."""
        out: dict[str, Any] = {"partition": self.partition, "offset": self.offset}
        if self.record_id is not None:
            out["id"] = self.record_id
        if self.group is not None:
            out["group"] = self.group
        return out


@attrs.frozen
class DuplicateExample:
    """An id read more than once: how many copies and where (at most the first few positions)."""

    record_id: int
    copies: int
    at: tuple[RecordRef, ...]
    group: str | None = None

    def to_json_dict(self) -> dict[str, Any]:
        """``{"id", "copies", "at": [{"partition", "offset"}], "group"?}``."""
        out: dict[str, Any] = {"id": self.record_id, "copies": self.copies, "at": [r.to_json_dict() for r in self.at]}
        if self.group is not None:
            out["group"] = self.group
        return out


@attrs.frozen
class GapRange:
    """Ids ``first``..``last`` (inclusive) that were never read."""

    first: int
    last: int
    group: str | None = None

    @property
    def size(self) -> int:
        """How many ids are missing."""
        return self.last - self.first + 1

    def to_json_dict(self) -> dict[str, Any]:
        """``{"from", "to", "group"?}``, inclusive."""
        out: dict[str, Any] = {"from": self.first, "to": self.last}
        if self.group is not None:
            out["group"] = self.group
        return out

    def __str__(self) -> str:
        return str(self.first) if self.first == self.last else f"{self.first}-{self.last}"


@attrs.frozen
class OpenTransaction:
    """A producer with a transaction ongoing on a partition (DescribeProducers), and whose it is if known."""

    producer_id: int
    producer_epoch: int
    start_offset: int
    transactional_id: str | None = None
    state: str | None = None

    def to_json_dict(self) -> dict[str, Any]:
        """Every field, with ``start_offset`` as the offset of the transaction's first record."""
        return attrs.asdict(self)


@attrs.frozen
class PinnedPartition:
    """A partition whose last stable offset stays below its high watermark: an open transaction holds it."""

    partition: int
    lso: int
    high_watermark: int
    open_transactions: tuple[OpenTransaction, ...] = ()

    @property
    def lag(self) -> int:
        """Offsets a read_committed consumer cannot reach yet."""
        return self.high_watermark - self.lso

    def to_json_dict(self) -> dict[str, Any]:
        """``{"partition", "lso", "high_watermark", "lag", "open_transactions": [...]}``."""
        return {"partition": self.partition, "lso": self.lso, "high_watermark": self.high_watermark,
                "lag": self.lag, "open_transactions": [t.to_json_dict() for t in self.open_transactions]}


@attrs.frozen
class GroupReport:
    """The figures of one ``--group-by`` group."""

    group: str
    records: int
    distinct_ids: int
    duplicates: int
    gaps: int
    gap_ranges: int
    gap_examples: tuple[GapRange, ...]
    range: tuple[int, int] | None

    def to_json_dict(self) -> dict[str, Any]:
        """Every figure, ranges as lists."""
        return {"records": self.records, "distinct_ids": self.distinct_ids, "duplicates": self.duplicates,
                "gaps": self.gaps, "gap_ranges": self.gap_ranges,
                "gap_examples": [g.to_json_dict() for g in self.gap_examples],
                "range": list(self.range) if self.range is not None else None}


@attrs.frozen
class AuditReport:
    """What an audit found. ``duplicates`` counts extra copies; ``gaps`` counts missing ids (in ``gap_ranges``
    runs); ``outside_range`` and ``unreadable`` count records."""

    records: int
    distinct_ids: int
    duplicates: int
    duplicate_examples: tuple[DuplicateExample, ...]
    gaps: int
    gap_ranges: int
    gap_examples: tuple[GapRange, ...]
    outside_range: int
    outside_range_examples: tuple[RecordRef, ...]
    unreadable: int
    unreadable_examples: tuple[RecordRef, ...]
    lso_pinned: tuple[PinnedPartition, ...]
    range: tuple[int, int] | None
    range_expected: bool
    groups: tuple[GroupReport, ...] | None = None
    topic: str | None = None
    end_offsets: Mapping[int, int] = attrs.field(factory=dict)
    high_watermarks: Mapping[int, int] = attrs.field(factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def clean(self) -> bool:
        """Every id exactly once, nothing unreadable or out of range, and no open transaction pins the LSO."""
        return not (self.duplicates or self.gaps or self.outside_range or self.unreadable or self.lso_pinned)

    @property
    def verdict(self) -> str:
        """``CLEAN`` or ``NOT CLEAN (n duplicates, m gaps, k outside range, LSO pinned on p partitions, u
        unreadable)``."""
        if self.clean:
            return "CLEAN"
        return (f"NOT CLEAN ({self.duplicates} duplicates, {self.gaps} gaps, {self.outside_range} outside range, "
                f"LSO pinned on {len(self.lso_pinned)} partitions, {self.unreadable} unreadable)")

    def to_json_dict(self) -> dict[str, Any]:
        """Every figure as plain JSON values (the ``--json`` output)."""
        return {
            "topic": self.topic,
            "records": self.records,
            "distinct_ids": self.distinct_ids,
            "duplicates": self.duplicates,
            "duplicate_examples": [d.to_json_dict() for d in self.duplicate_examples],
            "gaps": self.gaps,
            "gap_ranges": self.gap_ranges,
            "gap_examples": [g.to_json_dict() for g in self.gap_examples],
            "outside_range": self.outside_range,
            "outside_range_examples": [r.to_json_dict() for r in self.outside_range_examples],
            "unreadable": self.unreadable,
            "unreadable_examples": [r.to_json_dict() for r in self.unreadable_examples],
            "lso_pinned": [p.to_json_dict() for p in self.lso_pinned],
            "range": list(self.range) if self.range is not None else None,
            "range_source": None if self.range is None else "expected" if self.range_expected else "observed",
            "groups": None if self.groups is None else {g.group: g.to_json_dict() for g in self.groups},
            "end_offsets": {str(p): o for p, o in sorted(self.end_offsets.items())},
            "high_watermarks": {str(p): o for p, o in sorted(self.high_watermarks.items())},
            "notes": list(self.notes),
            "clean": self.clean,
            "verdict": self.verdict,
        }
