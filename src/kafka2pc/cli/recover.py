"""``kafka2pc recover``: complete what a sink decided and abort what it did not, outside the engine (a Spark query
that will not run again, a batch write whose driver died mid-completion), and resolve stuck decisions."""

from __future__ import annotations

import argparse
import json
from typing import Any

import attrs

from kafka2pc.cli.connection import add_connection_args, client_config
from kafka2pc.cluster import ClusterClient
from kafka2pc.errors import ConfigError
from kafka2pc.sink import RecoveryIncompleteError
from kafka2pc.sink.integration import FileDecisionLog, RecoveryReport, recover
from kafka2pc.sink.recovery import resolve_as_done, resolve_for_replay
from kafka2pc.transaction_control import TransactionControl


def _decision_log(args: argparse.Namespace) -> tuple[str, FileDecisionLog]:
    if args.checkpoint_location:
        from kafka2pc.spark.options import checkpoint_location  # noqa: PLC0415 - only this path knows Spark's layout
        from kafka2pc.spark.state import SinkStore  # noqa: PLC0415

        store = SinkStore(checkpoint_location("--checkpoint-location", args.checkpoint_location))
        state = store.load()
        if state is None:
            raise ConfigError("--checkpoint-location", f"{store.directory} holds no kafka2pc sink state")
        return state.prefix, store.decision_log(state.prefix)
    if not (args.log_dir and args.prefix):
        raise ConfigError("--log-dir", "give --checkpoint-location (a Spark query's or batch write's), or --log-dir "
                                       "and --prefix")
    return args.prefix, FileDecisionLog(args.log_dir, args.prefix, retain_done=None)


def _render(report: RecoveryReport, stuck: dict[int, str]) -> str:
    lines = [f"checkpoints rolled forward  {', '.join(map(str, report.checkpoints_rolled_forward)) or '-'}",
             f"transactions committed      {len(report.rolled_forward)}",
             f"lingering ones aborted      {len(report.aborted)}" + (f": {', '.join(report.aborted)}"
                                                                      if report.aborted else ""),
             f"took                        {report.seconds * 1000:.0f} ms"]
    lines += [f"STUCK checkpoint {c}: {why}" for c, why in sorted(stuck.items())]
    lines.append("recovery: " + ("INCOMPLETE (resolve with --resolve CHECKPOINT --reason ...)" if stuck
                                 else "COMPLETE"))
    return "\n".join(lines)


def run_recover(args: argparse.Namespace) -> int:
    """Run ``kafka2pc recover``: 0 when complete, 1 when decisions are stuck."""
    prefix, log = _decision_log(args)
    if args.replay and args.resolve is None:
        raise ConfigError("--replay", "goes with --resolve CHECKPOINT")
    if args.resolve is not None and not args.reason:
        raise ConfigError("--reason", "a resolution is recorded with its reason")
    with ClusterClient(client_config(args)) as client:
        control = TransactionControl(client)
        if args.resolve is not None and args.replay:
            resolve_for_replay(control, log, args.resolve, args.reason)
        elif args.resolve is not None:
            resolve_as_done(control, log, args.resolve, args.reason)
        stuck: dict[int, str] = {}
        if args.checkpoint_location:  # late task attempts of the stopped query stop instead of opening transactions
            from kafka2pc.spark.window import move_window  # noqa: PLC0415

            move_window(control, prefix)
        try:
            report = recover(control, prefix, log, report_known=False)
        except RecoveryIncompleteError as exc:
            report, stuck = exc.report, {c: str(e) for c, e in exc.stuck.items()}
    if args.json:
        body: dict[str, Any] = {**attrs.asdict(report), "prefix": prefix, "complete": not stuck,
                                "stuck": {str(c): why for c, why in stuck.items()}}
        print(json.dumps(body, indent=2, sort_keys=True))
    else:
        print(_render(report, stuck))
    return 1 if stuck else 0


def add_recover_command(commands: Any) -> None:
    """Register ``recover`` on the top-level sub-parser collection."""
    parser = commands.add_parser(
        "recover", help="complete decided checkpoints and abort lingering transactions of a sink",
        description="Roll every undone decision of a sink's decision log forward, then abort every other open "
                    "transaction of its prefix (LISTING). Exit 0 when complete, 1 when a decision is stuck.")
    add_connection_args(parser)
    parser.add_argument("--checkpoint-location", metavar="PATH",
                        help="a Spark query's (or batch write's) checkpointLocation")
    parser.add_argument("--log-dir", metavar="PATH", help="a FileDecisionLog directory (with --prefix)")
    parser.add_argument("--prefix", metavar="P", help="the transactional-id prefix of --log-dir")
    parser.add_argument("--resolve", type=int, metavar="CHECKPOINT",
                        help="first mark this stuck decision resolved (recorded with --reason)")
    parser.add_argument("--reason", metavar="TEXT", help="why the stuck decision is resolved")
    parser.add_argument("--replay", action="store_true",
                        help="with --resolve: abandon the decision instead of counting it done, so the query's "
                             "replay of that batch (or the same keyed write run again) writes all its rows anew; "
                             "refused unless every transaction of it is known aborted (each is aborted first)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run_recover)
