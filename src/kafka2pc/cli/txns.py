"""``kafka2pc txns``: list, describe, abort and find hanging transactions, by the sink's id grammar."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from kafka2pc.cli.connection import add_connection_args, client_config
from kafka2pc.cluster import ClusterClient
from kafka2pc.errors import CommandRefusedError
from kafka2pc.sink.naming import TransactionalIdGrammar
from kafka2pc.transaction_control import OPEN_STATES, TransactionControl, TransactionDescription

_DURATION = re.compile(r"(\d+)(ms|s|m|h|d)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_STATES = ("Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort", "Dead",
           "PrepareEpochFence")


def parse_duration_ms(text: str) -> int:
    """``500ms``, ``30s``, ``10m``, ``2h``, ``7d`` -> milliseconds."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"expected a duration like 500ms, 30s, 10m, 2h or 7d, got {text!r}")
    return int(match.group(1)) * _UNIT_MS[match.group(2)]


def _grammar(prefix: str | None) -> TransactionalIdGrammar | None:
    return TransactionalIdGrammar(prefix) if prefix is not None else None


def text_table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    if not rows:
        return "(none)"
    cells = [[", ".join(map(str, row[c])) if isinstance(row[c], list) else str(row[c]) for c in columns]
             for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(line.rstrip() for line in lines)


def _emit(args: argparse.Namespace, rows: list[dict[str, Any]], columns: Sequence[str]) -> None:
    print(json.dumps(rows, indent=2, sort_keys=True) if args.json else text_table(rows, columns))


def _describe_row(found: TransactionDescription, now_ms: int) -> dict[str, Any]:
    row = attrs.asdict(found)
    row["partitions"] = [f"{t}-{p}" for t, p in found.partitions]
    row["age_ms"] = now_ms - found.start_time_ms if found.start_time_ms > 0 else None
    return row


def _open_under(control: TransactionControl, grammar: TransactionalIdGrammar | None,
                older_than_ms: int | None = None) -> list[str]:
    pattern = f"^{grammar.pattern}$" if grammar else None
    listed = control.list(states=OPEN_STATES, pattern=pattern, running_longer_than_ms=older_than_ms)
    return [t.transactional_id for t in listed if grammar is None or grammar.owns(t.transactional_id)]


def txns_list(control: TransactionControl, args: argparse.Namespace) -> int:
    grammar = _grammar(args.prefix)
    listed = control.list(states=args.state or (), pattern=f"^{grammar.pattern}$" if grammar else None,
                          running_longer_than_ms=args.older_than)
    rows = [attrs.asdict(t) for t in listed if grammar is None or grammar.owns(t.transactional_id)]
    _emit(args, rows, ("transactional_id", "state", "producer_id"))
    return 0


def txns_describe(control: TransactionControl, args: argparse.Namespace) -> int:
    now = int(time.time() * 1000)
    rows = []
    for transactional_id in args.ids:
        found = control.describe_full(transactional_id)
        if found is None:
            print(f"kafka2pc txns describe: {transactional_id!r} is not known to its coordinator", file=sys.stderr)
            return 1
        rows.append(_describe_row(found, now))
    _emit(args, rows, ("transactional_id", "state", "producer_id", "epoch", "timeout_ms", "age_ms", "partitions"))
    return 0


def _confirm(count: int, assume_yes: bool) -> bool:
    if assume_yes:
        return True
    if not sys.stdin.isatty():
        raise CommandRefusedError("standard input is not a terminal: pass --yes to abort without asking")
    answer = input(f"Abort {count} transaction(s)? [y/N] ")
    return answer.strip().lower() in ("y", "yes")


def txns_abort(control: TransactionControl, args: argparse.Namespace) -> int:
    keep = set(args.keep or ())
    if args.prefix is not None:
        if args.ids:
            raise CommandRefusedError("give transactional ids or --prefix, not both")
        candidates = _open_under(control, _grammar(args.prefix))
    else:
        if not args.ids:
            raise CommandRefusedError("give transactional ids or --prefix")
        open_now = set(_open_under(control, None))
        candidates = [i for i in args.ids if i in open_now]
        for missing in sorted(set(args.ids) - open_now):
            print(f"{missing}: no open transaction", file=sys.stderr)
    targets = [c for c in candidates if c not in keep]
    for transactional_id in targets:
        print(f"{'would abort' if args.dry_run else 'to abort'}: {transactional_id}")
    for kept in sorted(keep & set(candidates)):
        print(f"kept: {kept}")
    if args.dry_run or not targets:
        print(f"{len(targets)} transaction(s) {'would be aborted' if args.dry_run else 'to abort'}")
        return 0
    if not _confirm(len(targets), args.yes):
        print("nothing aborted")
        return 1
    aborted = [t for t in targets if control.abort_ongoing(t) is not None]
    for transactional_id in aborted:
        print(f"aborted: {transactional_id}")
    print(f"{len(aborted)} transaction(s) aborted")
    return 0


def txns_find_hanging(control: TransactionControl, args: argparse.Namespace) -> int:
    threshold = args.older_than
    if threshold is None:
        configured = control.broker_config("transaction.max.timeout.ms")
        threshold = int(configured or 900_000) + 5 * 60_000
    now = int(time.time() * 1000)
    rows = []
    for transactional_id in _open_under(control, _grammar(args.prefix)):
        found = control.describe_full(transactional_id)
        if found is not None and found.state in OPEN_STATES and 0 < found.start_time_ms <= now - threshold:
            rows.append(_describe_row(found, now))
    if not args.json:
        print(f"open transactions older than {threshold} ms:")
    _emit(args, rows, ("transactional_id", "state", "producer_id", "epoch", "age_ms", "partitions"))
    return 0


def add_txns_commands(commands: Any) -> None:
    """Register ``txns list|describe|abort|find-hanging`` on the top-level sub-parser collection."""
    txns = commands.add_parser("txns", help="list, describe and abort transactions",
                               description="Operate on transactions. --prefix P means ids of the exact form "
                                           "P-<subtask>-<counter>, as the kafka2pc sink names them.")
    sub = txns.add_subparsers(dest="txns_command", required=True, metavar="SUBCOMMAND")

    def command(name: str, run: Callable[[TransactionControl, argparse.Namespace], int], helptext: str,
                *, prefix: bool = True, output: bool = True) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = sub.add_parser(name, help=helptext, description=helptext)
        add_connection_args(parser)
        if prefix:
            parser.add_argument("--prefix", metavar="P", help="only ids of the form P-<subtask>-<counter>")
        if output:
            parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
        parser.set_defaults(run=_with_control(run))
        return parser

    listing = command("list", txns_list, "list transactions")
    listing.add_argument("--state", action="append", choices=_STATES, help="only this state; repeatable")
    listing.add_argument("--older-than", type=parse_duration_ms, metavar="DURATION",
                         help="only transactions running longer than this (10m, 2h; ListTransactions v1+)")
    describe = command("describe", txns_describe, "describe transactions by id", prefix=False)
    describe.add_argument("ids", nargs="+", metavar="ID")
    abort = command("abort", txns_abort, "abort open transactions by id or by prefix", output=False)
    abort.add_argument("ids", nargs="*", metavar="ID")
    abort.add_argument("--keep", action="append", metavar="ID", help="never abort this id; repeatable")
    abort.add_argument("--dry-run", action="store_true", help="only say what would be aborted")
    abort.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    hanging = command("find-hanging", txns_find_hanging,
                      "open transactions older than transaction.max.timeout.ms + 5 min (or --older-than)")
    hanging.add_argument("--older-than", type=parse_duration_ms, metavar="DURATION",
                         help="threshold instead of the broker's transaction.max.timeout.ms + 5m")


def _with_control(run: Callable[[TransactionControl, argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def wrapped(args: argparse.Namespace) -> int:
        with ClusterClient(client_config(args), bootstrap_timeout_s=30.0) as client:
            return run(TransactionControl(client), args)

    return wrapped
