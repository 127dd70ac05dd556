"""``kafka2pc fleet``: the ids a fleet of DualWriterPools leases under one prefix, from the state table: each id's
holder (host:pid), heartbeat age, lease, and the state of its last transaction; with ``--bootstrap``, Kafka's view
of each id too; ``--settle`` settles the expired leases now (what a live pool's keeper does)."""

from __future__ import annotations

import argparse
import json
import sqlite3
import time
from typing import Any
from urllib.parse import unquote, urlsplit

from kafka2pc.cli.connection import add_connection_args, client_settings
from kafka2pc.cli.txns import text_table
from kafka2pc.cluster import ClusterClient
from kafka2pc.config import ClientConfig
from kafka2pc.dualwrite.connection import adapt
from kafka2pc.dualwrite.leases import FleetRow, LeaseTable
from kafka2pc.dualwrite.state_table import StateTable
from kafka2pc.errors import CommandRefusedError, ConfigError, DatabaseConnectionLostError, Kafka2pcError
from kafka2pc.transaction_control import OPEN_STATES, TransactionControl

_COLUMNS = ("transactional_id", "status", "holder", "heartbeat_age_s", "lease_left_s", "last_transaction")


def add_fleet_command(commands: Any) -> None:
    parser = commands.add_parser("fleet", help="the ids a fleet of DualWriterPools leases, from the state table",
                                 description=__doc__)
    parser.add_argument("--db", required=True, metavar="DSN",
                        help="the state table's database: sqlite:PATH, a PostgreSQL connection string "
                             "(postgresql://... or 'host=... dbname=...'; needs kafka2pc[postgres]), or "
                             "mysql://user[:password]@host[:port]/database for MariaDB (needs kafka2pc[mysql])")
    parser.add_argument("--prefix", required=True, help="the fleet's transactional.id prefix")
    parser.add_argument("--state-table", default="kafka2pc_dual_write_state", help="the state table's name")
    add_connection_args(parser, required=False)
    parser.add_argument("--settle", action="store_true",
                        help="claim and settle every expired lease now (needs --bootstrap): commit what the "
                             "database committed, abort the rest")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(run=run_fleet)


def connect(dsn: str) -> Any:
    """A DB-API connection to ``dsn``; a database that cannot be reached is DatabaseConnectionLostError (the
    driver's message, which names the host and port, never the password)."""
    try:
        return _connect(dsn)
    except Kafka2pcError:
        raise
    except Exception as exc:
        raise DatabaseConnectionLostError(f"--db: cannot connect ({type(exc).__name__}: {exc})") from exc


def _connect(dsn: str) -> Any:
    if dsn.startswith("sqlite:"):
        return sqlite3.connect(dsn.removeprefix("sqlite:").removeprefix("//"), timeout=30, check_same_thread=False)
    if dsn.startswith(("mysql://", "mariadb://")):
        return _connect_mysql(dsn)
    try:
        import psycopg  # noqa: PLC0415 - the postgres extra
    except ImportError:
        raise ConfigError("--db", "a PostgreSQL DSN needs psycopg: pip install 'kafka2pc[postgres]'") from None
    return psycopg.connect(dsn)


def _connect_mysql(url: str) -> Any:
    try:
        import pymysql  # noqa: PLC0415 - the mysql extra
    except ImportError:
        raise ConfigError("--db", "a mysql:// URL needs PyMySQL: pip install 'kafka2pc[mysql]'") from None
    parts = urlsplit(url)
    if not parts.path.strip("/"):
        raise ConfigError("--db", "a mysql:// URL names its database: mysql://user@host:3306/database")
    return pymysql.connect(host=parts.hostname or "127.0.0.1", port=parts.port or 3306, user=parts.username or "",
                           password=unquote(parts.password or ""), database=parts.path.strip("/"))


def run_fleet(args: argparse.Namespace) -> int:
    if args.settle and not args.bootstrap:
        raise CommandRefusedError("--settle needs --bootstrap: settling completes or aborts Kafka transactions")
    connection = connect(args.db)
    try:
        table = StateTable(adapt(connection), args.state_table, create=False)
        if args.settle:
            print(f"settled {_settle(args, connection)} expired lease(s)")
        rows = [_row(found) for found in LeaseTable(table, args.prefix).rows()]
    finally:
        connection.close()
    if args.bootstrap:
        _add_kafka_view(args, rows)
    columns = (*_COLUMNS, "kafka") if args.bootstrap else _COLUMNS
    print(json.dumps(rows, indent=2, sort_keys=True) if args.json else text_table([_shown(r) for r in rows], columns))
    return 0


def _row(found: FleetRow) -> dict[str, Any]:
    """One id, with JSON's types (numbers, null)."""
    last = None if found.prepared_state is None else \
        f"{found.prepared_state} {'completed' if found.completed else 'committed by the database'}"
    return {"transactional_id": found.transactional_id, "status": found.status, "holder": found.holder,
            "heartbeat_age_s": found.heartbeat_age_s, "lease_left_s": found.lease_left_s,
            "last_transaction": last, "problem": found.problem}


def _shown(row: dict[str, Any]) -> dict[str, Any]:
    """The row as the table prints it."""
    def text(value: Any) -> str:
        return "-" if value is None else f"{value:.1f}" if isinstance(value, float) else str(value)
    return {key: text(value) for key, value in row.items()}


def _settle(args: argparse.Namespace, connection: Any) -> int:
    from kafka2pc.dualwrite.pool import DualWriterPool  # noqa: PLC0415 - only here

    config = {**client_settings(args), "transactional.id": args.prefix}
    pool = DualWriterPool(lambda: connect(args.db), config, size=1, min_size=0, state_table=args.state_table,
                          create_state_table=False)
    try:
        return pool.settle_expired()
    finally:
        pool.close()


def _add_kafka_view(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    """Each id's transaction as its coordinator describes it: open ones with their age (they hold back
    read_committed consumers of their partitions)."""
    now_ms = int(time.time() * 1000)
    with ClusterClient(ClientConfig.from_dict(client_settings(args))) as client:
        control = TransactionControl(client)
        for row in rows:
            found = control.describe_full(row["transactional_id"])
            if found is None:
                row["kafka"] = "unknown to the coordinator"
            elif found.state in OPEN_STATES and found.start_time_ms > 0:
                row["kafka"] = f"{found.state} for {(now_ms - found.start_time_ms) / 1000:.1f} s"
            else:
                row["kafka"] = found.state
