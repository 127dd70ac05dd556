"""The ``kafka2pc`` command line."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence

from kafka2pc.capabilities import DEFAULT_PROBE_TRANSACTIONAL_ID, BrokerCapabilities, probe_capabilities
from kafka2pc.cli_audit import add_audit_command
from kafka2pc.cli_recover import add_recover_command
from kafka2pc.cli_txns import add_txns_commands
from kafka2pc.cluster_client import ClusterClient
from kafka2pc.config import ClientConfig
from kafka2pc.errors import Kafka2pcError


def _config_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key.strip(), value.strip()


def _client_config(args: argparse.Namespace) -> ClientConfig:
    settings: dict[str, object] = dict(args.config or [])
    settings["bootstrap.servers"] = args.bootstrap
    return ClientConfig.from_dict(settings)


def _add_connection_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", required=True, metavar="HOST:PORT[,HOST:PORT]",
                        help="the cluster's bootstrap servers")
    parser.add_argument("--config", "-X", action="append", type=_config_pair, metavar="KEY=VALUE",
                        help="a client setting with Kafka's dotted name (security.protocol, sasl.*, ssl.*); repeatable")


def _render_capabilities(caps: BrokerCapabilities) -> str:
    def yes(flag: bool) -> str:
        return "yes" if flag else "NO"

    rows = [
        ("bootstrap servers", caps.bootstrap_servers),
        ("InitProducerId max version", str(caps.init_producer_id_max_version)),
        ("EndTxn max version", str(caps.end_txn_max_version)),
        ("ListTransactions max version", str(caps.list_transactions_max_version)),
        ("DescribeTransactions max version", str(caps.describe_transactions_max_version)),
        ("Enable2Pc accepted", f"{yes(caps.enable_2pc)} - {caps.enable_2pc_detail}"),
        ("keepPreparedTxn accepted", f"{yes(caps.keep_prepared_txn)} - {caps.keep_prepared_txn_detail}"),
        ("transaction protocol (transaction.version)", str(caps.transaction_version)),
        ("transaction.max.timeout.ms", str(caps.transaction_max_timeout_ms)),
        ("transaction.two.phase.commit.enable", str(caps.two_phase_commit_broker_config)),
        ("ListTransactions id-pattern filter", yes(caps.list_transactions_pattern_filter)),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"{name.ljust(width)}  {value}" for name, value in rows]
    if caps.enable_2pc:
        verdict = "two-phase commit: ACTIVE (prepared transactions never time out on the broker)"
    else:
        verdict = ("two-phase commit: FALLBACK (standard transactions bounded by "
                   f"transaction.max.timeout.ms={caps.transaction_max_timeout_ms})")
    return "\n".join([*lines, "", verdict])


def _doctor(args: argparse.Namespace) -> int:
    with ClusterClient(_client_config(args), bootstrap_timeout_s=args.timeout) as client:
        caps = probe_capabilities(client, probe_transactional_id=args.probe_id)
    if args.json:
        print(json.dumps(caps.to_json_dict(), indent=2, sort_keys=True))
    else:
        print(_render_capabilities(caps))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``kafka2pc`` command."""
    parser = argparse.ArgumentParser(prog="kafka2pc", description="Kafka two-phase commit tools")
    parser.add_argument("--verbose", "-v", action="store_true", help="log kafka2pc's own debug messages")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    doctor = commands.add_parser("doctor", help="report what the cluster supports for two-phase commit",
                                 description="Ask a cluster what it supports for two-phase commit (KIP-939).")
    _add_connection_args(doctor)
    doctor.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    doctor.add_argument("--probe-id", default=DEFAULT_PROBE_TRANSACTIONAL_ID, metavar="TRANSACTIONAL_ID",
                        help="throwaway transactional id used to try InitProducerId (default: %(default)s)")
    doctor.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                        help="how long to wait for the cluster to answer (default: %(default)s)")
    doctor.set_defaults(run=_doctor)

    add_txns_commands(commands, _add_connection_args)
    add_audit_command(commands, _add_connection_args)
    add_recover_command(commands, _add_connection_args)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kafka2pc`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        logging.getLogger("kafka").setLevel(logging.CRITICAL)
    try:
        code: int = args.run(args)
    except Kafka2pcError as exc:
        command = " ".join(filter(None, (args.command, getattr(args, "txns_command", None))))
        print(f"kafka2pc {command}: error: {exc}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    raise SystemExit(main())
