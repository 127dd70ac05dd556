"""The pure part of an audit: ``(partition, offset, id-or-None)`` entries and the partitions' end offsets in, an
:class:`~kafka2pc.audit.report.AuditReport` out, without a broker."""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kafka2pc.audit.report import (
    AuditReport,
    DuplicateExample,
    GapRange,
    GroupReport,
    OpenTransaction,
    PinnedPartition,
    RecordRef,
)

#: ``(partition, offset, id)`` or ``(partition, offset, id, group)``; id None means the record's id was unreadable.
Entry = tuple[int, int, int | None] | tuple[int, int, int | None, str | None]

_DECIMAL = re.compile(r"-?[0-9]+")


def _group_order(group: str | None) -> tuple[int, int, str]:
    """Groups in natural order: numbers numerically, then strings."""
    if group is None:
        return (0, 0, "")
    if _DECIMAL.fullmatch(group):
        return (0, int(group), "")
    return (1, 0, group)


class _Smallest:
    """The ``k`` smallest tuples offered so far."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.items: list[tuple[Any, ...]] = []

    def offer(self, item: tuple[Any, ...]) -> tuple[bool, tuple[Any, ...] | None]:
        """Keep ``item`` if it is among the k smallest: (kept, the item it pushed out)."""
        if self.k <= 0 or (len(self.items) >= self.k and item >= self.items[-1]):
            return False, None
        bisect.insort(self.items, item)
        return True, self.items.pop() if len(self.items) > self.k else None


class _GroupTally:
    """Ids of one group: where each was first read, and how many extra copies."""

    def __init__(self) -> None:
        self.first_seen: dict[int, tuple[int, int]] = {}
        self.records = 0
        self.duplicates = 0

    def gaps(self, bounds: tuple[int, int] | None, group: str | None,
             max_examples: int) -> tuple[int, int, tuple[GapRange, ...]]:
        """(missing ids, runs of them, the first few runs) within ``bounds`` (inclusive)."""
        if bounds is None:
            return 0, 0, ()
        low, high = bounds
        missing = runs = 0
        examples: list[GapRange] = []
        previous = low - 1
        for record_id in [*sorted(i for i in self.first_seen if low <= i <= high), high + 1]:
            if record_id > previous + 1:
                missing += record_id - previous - 1
                runs += 1
                if len(examples) < max_examples:
                    examples.append(GapRange(previous + 1, record_id - 1, group))
            previous = record_id
        return missing, runs, tuple(examples)

    def observed_range(self) -> tuple[int, int] | None:
        """min..max of the ids read, or None."""
        return (min(self.first_seen), max(self.first_seen)) if self.first_seen else None


class Tally:
    """Accumulates entries one at a time (memory: one dict entry per distinct id), then makes the report."""

    _MAX_POSITIONS = 10  # positions listed per duplicate example

    def __init__(self, *, expect_range: tuple[int, int] | None = None, max_examples: int = 5,
                 grouped: bool = False) -> None:
        if expect_range is not None and expect_range[0] > expect_range[1]:
            raise ValueError(f"empty range {expect_range[0]}:{expect_range[1]}")
        self.expect_range = expect_range
        self.max_examples = max_examples
        self.grouped = grouped
        self.records = 0
        self.groups: dict[str | None, _GroupTally] = {}
        self._duplicate_keys = _Smallest(max_examples)
        self._duplicate_positions: dict[tuple[Any, ...], tuple[int, list[tuple[int, int]]]] = {}
        self.outside_range = 0
        self._outside = _Smallest(max_examples)
        self.unreadable = 0
        self._unreadable = _Smallest(max_examples)

    def add(self, partition: int, offset: int, record_id: int | None, group: str | None = None) -> None:
        """Count one record; ``record_id`` None means its id (or group) could not be read."""
        self.records += 1
        if record_id is None:
            self.unreadable += 1
            self._unreadable.offer((partition, offset))
            return
        tally = self.groups.get(group)
        if tally is None:
            tally = self.groups[group] = _GroupTally()
        tally.records += 1
        if self.expect_range is not None and not self.expect_range[0] <= record_id <= self.expect_range[1]:
            self.outside_range += 1
            self._outside.offer((partition, offset, record_id, group))
        first = tally.first_seen.get(record_id)
        if first is None:
            tally.first_seen[record_id] = (partition, offset)
            return
        tally.duplicates += 1
        key = (_group_order(group), record_id, group)
        known = self._duplicate_positions.get(key)
        if known is not None:
            copies, positions = known
            if len(positions) < self._MAX_POSITIONS:
                positions.append((partition, offset))
            self._duplicate_positions[key] = (copies + 1, positions)
            return
        kept, dropped = self._duplicate_keys.offer(key)
        if kept:  # an id only ever enters at its second copy: a smaller one can displace it, never the reverse
            self._duplicate_positions[key] = (2, [first, (partition, offset)])
        if dropped is not None:
            del self._duplicate_positions[dropped]

    def report(self, *, end_offsets: Mapping[int, int] | None = None, high_watermarks: Mapping[int, int] | None = None,
               open_transactions: Mapping[int, Sequence[OpenTransaction]] | None = None, topic: str | None = None,
               notes: Sequence[str] = ()) -> AuditReport:
        """The report over everything added; partitions whose high watermark exceeds the end offset are pinned."""
        ends = dict(end_offsets or {})
        marks = dict(high_watermarks or ends)
        open_by_partition = open_transactions or {}
        pinned = tuple(PinnedPartition(p, ends[p], marks[p], tuple(open_by_partition.get(p, ())))
                       for p in sorted(ends) if marks.get(p, ends[p]) > ends[p])
        if not self.grouped:
            self.groups.setdefault(None, _GroupTally())  # an expected range with nothing read is one big gap
        group_reports = []
        for group in sorted(self.groups, key=_group_order):
            tally = self.groups[group]
            bounds = self.expect_range or tally.observed_range()
            missing, runs, examples = tally.gaps(bounds, group, self.max_examples)
            group_reports.append(GroupReport(group or "", tally.records, len(tally.first_seen), tally.duplicates,
                                             missing, runs, examples, bounds))
        every_id = [r for t in self.groups.values() for r in (t.observed_range() or ())]
        overall = self.expect_range or ((min(every_id), max(every_id)) if every_id else None)
        gap_examples = [g for r in group_reports for g in r.gap_examples][:self.max_examples]
        duplicates = tuple(
            DuplicateExample(key[1], copies, tuple(RecordRef(p, o) for p, o in sorted(positions)), key[2])
            for key in self._duplicate_keys.items for copies, positions in [self._duplicate_positions[key]])
        return AuditReport(
            records=self.records,
            distinct_ids=sum(r.distinct_ids for r in group_reports),
            duplicates=sum(r.duplicates for r in group_reports),
            duplicate_examples=duplicates,
            gaps=sum(r.gaps for r in group_reports),
            gap_ranges=sum(r.gap_ranges for r in group_reports),
            gap_examples=tuple(gap_examples),
            outside_range=self.outside_range,
            outside_range_examples=tuple(RecordRef(*item) for item in self._outside.items),
            unreadable=self.unreadable,
            unreadable_examples=tuple(RecordRef(p, o) for p, o in self._unreadable.items),
            lso_pinned=pinned,
            range=overall,
            range_expected=self.expect_range is not None,
            groups=tuple(group_reports) if self.grouped else None,
            topic=topic,
            end_offsets=ends,
            high_watermarks=marks,
            notes=tuple(notes),
        )


def compute_report(entries: Iterable[Entry], *, expect_range: tuple[int, int] | None = None,
                   end_offsets: Mapping[int, int] | None = None, high_watermarks: Mapping[int, int] | None = None,
                   open_transactions: Mapping[int, Sequence[OpenTransaction]] | None = None,
                   grouped: bool = False, max_examples: int = 5, topic: str | None = None,
                   notes: Sequence[str] = ()) -> AuditReport:
    """The audit of ``entries``: ``(partition, offset, id-or-None[, group])``. ``end_offsets`` are the
    read_committed end offsets (LSO) and ``high_watermarks`` the read_uncommitted ones, per partition."""
    tally = Tally(expect_range=expect_range, max_examples=max_examples, grouped=grouped)
    for entry in entries:
        tally.add(entry[0], entry[1], entry[2], entry[3] if len(entry) > 3 else None)
    return tally.report(end_offsets=end_offsets, high_watermarks=high_watermarks,
                        open_transactions=open_transactions, topic=topic, notes=notes)
