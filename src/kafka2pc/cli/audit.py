"""``kafka2pc audit``: check that a topic holds every id exactly once, and that no open transaction pins it."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kafka2pc.audit import AuditReport, RecordDecoder, audit_topic
from kafka2pc.cli.connection import add_connection_args, client_settings
from kafka2pc.errors import Kafka2pcError

EXIT_CLEAN, EXIT_NOT_CLEAN, EXIT_ERROR = 0, 1, 2


def parse_range(text: str) -> tuple[int, int]:
    """``LO:HI`` (inclusive, LO <= HI) -> (LO, HI)."""
    low, sep, high = text.partition(":")
    try:
        bounds = (int(low), int(high)) if sep else None
    except ValueError:
        bounds = None
    if bounds is None or bounds[0] > bounds[1]:
        raise argparse.ArgumentTypeError(f"expected LO:HI with integers LO <= HI, got {text!r}")
    return bounds


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _in_group(group: str | None) -> str:
    return f" in group {group}" if group is not None else ""


def _positions(refs: Any) -> str:
    return ", ".join(f"{r.partition}:{r.offset}" for r in refs)


def render_report(report: AuditReport) -> str:
    """The human-readable table, ending with the verdict line."""
    def more(shown: int, total: int) -> str:
        return f", ... ({total - shown} more)" if total > shown else ""

    rows: list[tuple[str, str]] = [("topic", f"{report.topic} ({_count(len(report.end_offsets), 'partition')})"),
                                   ("records read", str(report.records)),
                                   ("distinct ids", str(report.distinct_ids))]
    if report.range is not None:
        source = "expected" if report.range_expected else "min..max of ids read"
        rows.append(("id range", f"{report.range[0]}..{report.range[1]} ({source})"))
    lines = [f"{name:<16}{value}" for name, value in rows]
    lines.append(f"{'duplicates':<16}{report.duplicates} extra {'copy' if report.duplicates == 1 else 'copies'}")
    lines += [f"  id {d.record_id}{_in_group(d.group)}: {d.copies} copies at "
              f"{_positions(d.at)}" for d in report.duplicate_examples]
    lines.append(f"{'gaps':<16}{_count(report.gaps, 'missing id')}"
                 + (f" in {_count(report.gap_ranges, 'range')}" if report.gap_ranges else ""))
    if report.gap_examples:
        lines.append("  " + ", ".join(f"{g}{_in_group(g.group)}" for g in report.gap_examples)
                     + more(len(report.gap_examples), report.gap_ranges))
    lines.append(f"{'outside range':<16}{_count(report.outside_range, 'record')}")
    lines += [f"  id {r.record_id}{_in_group(r.group)} at {r.partition}:{r.offset}"
              for r in report.outside_range_examples]
    lines.append(f"{'unreadable':<16}{_count(report.unreadable, 'record')}")
    if report.unreadable_examples:
        lines.append(f"  at {_positions(report.unreadable_examples)}"
                     f"{more(len(report.unreadable_examples), report.unreadable)}")
    lines.append(f"{'LSO pinned':<16}{_count(len(report.lso_pinned), 'partition') if report.lso_pinned else 'no'}")
    for pinned in report.lso_pinned:
        lines.append(f"  partition {pinned.partition}: LSO {pinned.lso}, high watermark {pinned.high_watermark} "
                     f"({_count(pinned.lag, 'offset')} not readable yet)")
        for txn in pinned.open_transactions:
            owner = f"transactional id {txn.transactional_id!r} ({txn.state})" if txn.transactional_id else \
                "transactional id unknown"
            lines.append(f"    open transaction of producer id {txn.producer_id} epoch {txn.producer_epoch} "
                         f"from offset {txn.start_offset}: {owner}")
    if report.groups is not None:
        lines.append(f"{'groups':<16}{len(report.groups)}")
        lines += [f"  {g.group}: {_count(g.records, 'record')}, {_count(g.distinct_ids, 'id')}, "
                  f"{_count(g.duplicates, 'duplicate')}, {_count(g.gaps, 'missing id')}"
                  + (f" ({', '.join(map(str, g.gap_examples))})" if g.gap_examples else "")
                  for g in report.groups]
    lines += [f"note: {note}" for note in report.notes]
    return "\n".join([*lines, "", f"verdict: {report.verdict}"])


def run_audit(args: argparse.Namespace) -> int:
    """Run ``kafka2pc audit``: 0 when clean, 1 when not, 2 when the audit could not be done."""
    settings = client_settings(args)
    decoder = RecordDecoder(id_field=None if args.id_from_key else args.id_field, group_field=args.group_by)
    try:
        report = audit_topic(settings, args.topic, decoder, expect_range=args.expect_range, settle_s=args.settle,
                             timeout_s=args.timeout, max_examples=args.examples)
    except Kafka2pcError as exc:
        print(f"kafka2pc audit: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        print(json.dumps(report.to_json_dict(), indent=2, sort_keys=True))
    else:
        print(render_report(report))
    return EXIT_CLEAN if report.clean else EXIT_NOT_CLEAN


def add_audit_command(commands: Any) -> None:
    """Register ``audit`` on the top-level sub-parser collection."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "audit", help="check that a topic holds every id exactly once",
        description="Read a topic as a read_committed consumer (confluent-kafka) up to the end offsets taken at the "
                    "start and report duplicates, gaps, ids outside the expected range, unreadable records and "
                    "open transactions that pin the last stable offset. Exit status: 0 clean, 1 not clean, "
                    "2 error.")
    add_connection_args(parser)
    parser.add_argument("--topic", required=True, help="the topic to audit")
    ids = parser.add_mutually_exclusive_group(required=True)
    ids.add_argument("--id-from-key", action="store_true", help="the record id is the key, a decimal integer")
    ids.add_argument("--id-field", metavar="NAME",
                     help="the record id is this integer field of the JSON value (a.b for nested fields)")
    parser.add_argument("--expect-range", type=parse_range, metavar="LO:HI",
                        help="the ids expected, inclusive (default: min..max of the ids read)")
    parser.add_argument("--group-by", metavar="FIELD",
                        help="audit each value of this JSON field separately (ids are unique per group)")
    parser.add_argument("--settle", type=float, default=5.0, metavar="SECONDS",
                        help="wait up to this long for ending transactions' markers (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                        help="give up (exit 2) if the end offsets are not reached by then (default: %(default)s)")
    parser.add_argument("--examples", type=int, default=5, metavar="N",
                        help="how many examples of each problem to show (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.set_defaults(run=run_audit)
