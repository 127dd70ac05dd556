"""``kafka2pc doctor``: what a cluster supports for two-phase commit, asked of it."""

from __future__ import annotations

import argparse
import json
from typing import Any

from kafka2pc.capabilities import DEFAULT_PROBE_TRANSACTIONAL_ID, BrokerCapabilities, probe_capabilities
from kafka2pc.cli.connection import add_connection_args, client_config
from kafka2pc.cluster import ClusterClient


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


def run_doctor(args: argparse.Namespace) -> int:
    with ClusterClient(client_config(args), bootstrap_timeout_s=args.timeout) as client:
        caps = probe_capabilities(client, probe_transactional_id=args.probe_id)
    if args.json:
        print(json.dumps(caps.to_json_dict(), indent=2, sort_keys=True))
    else:
        print(_render_capabilities(caps))
    return 0


def add_doctor_command(commands: Any) -> None:
    """Register ``doctor`` on the top-level sub-parser collection."""
    doctor = commands.add_parser("doctor", help="report what the cluster supports for two-phase commit",
                                 description="Ask a cluster what it supports for two-phase commit (KIP-939).")
    add_connection_args(doctor)
    doctor.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    doctor.add_argument("--probe-id", default=DEFAULT_PROBE_TRANSACTIONAL_ID, metavar="TRANSACTIONAL_ID",
                        help="throwaway transactional id used to try InitProducerId (default: %(default)s)")
    doctor.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                        help="how long to wait for the cluster to answer (default: %(default)s)")
    doctor.set_defaults(run=run_doctor)
