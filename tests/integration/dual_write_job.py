"""A dual-write order service for the kill tests: writes orders ``first .. first + count - 1`` (a DB row and a Kafka
record each, one dual-write transaction per order) and SIGKILLs itself at order ``kill_at`` in failure mode MODE:

    a: inside the block, after the row and the record (nothing prepared, nothing committed)
    b: Kafka prepared, before the database commit
    c: after the database commit, before Kafka's completion
    d: after the whole transaction

    python dual_write_job.py DB BOOTSTRAP TOPIC TRANSACTIONAL_ID FIRST COUNT KILL_AT MODE [CONFIG_JSON]

CONFIG_JSON: more producer settings (e.g. a transaction.timeout.ms the broker's maximum allows).

DB is ``sqlite:PATH``, ``mysql://...`` (MariaDB through PyMySQL), a libpq connection string, ``async:`` and one
(AsyncDualWriter on psycopg's AsyncConnection), or ``django:`` and one (DualWriter on Django's connection). The
connection is a subclass of the driver's own class, or Django's commit is wrapped: it kills the process where the
mode says, as an application's may."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import sys
from typing import Any

from kafka2pc.dualwrite import AsyncDualWriter, DualWriter


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class Killing:
    """Mixed into a connection class: commit() kills the process before or after committing when armed."""

    arm: str | None = None

    def commit(self) -> None:
        if self.arm == "b":
            die()
        super().commit()  # type: ignore[misc]
        if self.arm == "c":
            die()


class KillingAsync:
    """Killing, for an asyncio connection class."""

    arm: str | None = None

    async def commit(self) -> None:
        if self.arm == "b":
            die()
        await super().commit()  # type: ignore[misc]
        if self.arm == "c":
            die()


class KillingSqlite(Killing, sqlite3.Connection):
    pass


def connect(db: str):
    if db.startswith("sqlite:"):
        return sqlite3.connect(db.removeprefix("sqlite:"), factory=KillingSqlite, timeout=30,
                               check_same_thread=False)  # the pool job lends it to its threads
    if db.startswith("mysql:"):
        import pymysql  # noqa: PLC0415

        from kafka2pc_harness.mariadb import connect as connect_mariadb  # noqa: PLC0415

        class KillingPyMySQL(Killing, pymysql.connections.Connection):
            pass

        return connect_mariadb(db, factory=KillingPyMySQL)
    import psycopg  # noqa: PLC0415

    class KillingPostgres(Killing, psycopg.Connection):
        pass

    return KillingPostgres.connect(db)


async def write_async(dsn: str, config: dict, topic: str, orders: range, *, kill_at: int, mode: str) -> None:
    """The same order service on AsyncDualWriter: the same kills, at the same points. ``dsn``: a libpq string
    (psycopg's AsyncConnection), ``postgresql+asyncpg://...#schema`` (SQLAlchemy's AsyncConnection) or
    ``asyncpg:postgresql://...#schema`` (a bare asyncpg connection)."""
    import psycopg  # noqa: PLC0415

    class KillingAsyncPostgres(KillingAsync, psycopg.AsyncConnection):
        pass

    if dsn.startswith("asyncpg:"):  # a bare asyncpg connection: its transaction's COMMIT is an execute()
        import asyncpg  # noqa: PLC0415

        class KillingAsyncpg(asyncpg.Connection):  # type: ignore[misc]
            arm: str | None = None

            async def execute(self, query: str, *args: Any, **kwargs: Any) -> Any:
                committing = query.startswith("COMMIT")
                if committing and self.arm == "b":
                    die()
                status = await super().execute(query, *args, **kwargs)
                if committing and self.arm == "c":
                    die()
                return status

        url, _, schema = dsn.removeprefix("asyncpg:").partition("#")
        connection = await asyncpg.connect(url, server_settings={"search_path": schema},
                                           connection_class=KillingAsyncpg)
        insert = "INSERT INTO orders (id, amount) VALUES ($1, $2)"
    elif dsn.startswith("postgresql+"):  # SQLAlchemy's AsyncConnection (asyncpg), subclassed the same way
        from sqlalchemy import text  # noqa: PLC0415
        from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine  # noqa: PLC0415

        class KillingAsyncSqlAlchemy(KillingAsync, AsyncConnection):
            pass

        url, _, schema = dsn.partition("#")
        engine = create_async_engine(url, connect_args={"server_settings": {"search_path": schema}})
        connection = await KillingAsyncSqlAlchemy(engine).start()
        insert = text("INSERT INTO orders (id, amount) VALUES (:id, :amount)")
    else:
        connection = await KillingAsyncPostgres.connect(dsn)
        insert = None
    writer = AsyncDualWriter(connection, config)
    await writer.recover()
    for order in orders:
        async with writer.transaction() as tx:
            if insert is None:
                await tx.connection.execute("INSERT INTO orders (id, amount) VALUES (%s, %s)", (order, order % 100))
            elif isinstance(insert, str):
                await tx.connection.execute(insert, order, order % 100)
            else:
                await tx.connection.execute(insert, {"id": order, "amount": order % 100})
            tx.produce(topic, value=b'{"id": %d}' % order, key=str(order).encode())
            if order == kill_at:
                if mode == "a":
                    die()
                connection.arm = mode if mode in ("b", "c") else None
        if order == kill_at and mode == "d":
            die()
    await writer.close()


def write_django(dsn: str, config: dict, topic: str, orders: range, *, kill_at: int, mode: str) -> None:
    """The same order service on Django's connection and transaction management: the same kills."""
    from kafka2pc_harness.postgres import configure_django  # noqa: PLC0415 - Django's jobs only

    configure_django(dsn)
    from django.db import connection  # noqa: PLC0415

    writer = DualWriter(connection, config)
    writer.recover()
    wrapper = connection._connections[connection._alias]  # this thread's DatabaseWrapper, whose commit() Django calls
    commit = wrapper.commit

    def killing_commit() -> None:
        if wrapper.arm == "b":
            die()
        commit()
        if wrapper.arm == "c":
            die()

    wrapper.arm, wrapper.commit = None, killing_commit
    write_orders(writer, wrapper, "INSERT INTO orders (id, amount) VALUES (%s, %s)", topic, orders, kill_at=kill_at,
                 mode=mode)


def write_orders(writer: DualWriter, armed: Any, insert: str, topic: str, orders: range, *, kill_at: int,
                 mode: str) -> None:
    """The orders, one dual write each, dying at ``kill_at`` in ``mode`` (``armed.arm`` tells the commit)."""
    for order in orders:
        with writer.transaction() as tx:
            tx.cursor.execute(insert, (order, order % 100))
            tx.produce(topic, value=b'{"id": %d}' % order, key=str(order).encode())
            if order == kill_at:
                if mode == "a":
                    die()
                armed.arm = mode if mode in ("b", "c") else None
        if order == kill_at and mode == "d":
            die()
    writer.close()


def main() -> int:
    db, bootstrap, topic, transactional_id = sys.argv[1:5]
    first, count, kill_at = map(int, sys.argv[5:8])
    mode = sys.argv[8]
    extra = json.loads(sys.argv[9]) if len(sys.argv) > 9 else {}
    if db.startswith("django:"):
        config = {"bootstrap.servers": bootstrap, "transactional.id": transactional_id, **extra}
        write_django(db.removeprefix("django:"), config, topic, range(first, first + count), kill_at=kill_at,
                     mode=mode)
        return 0
    if db.startswith("async:"):
        config = {"bootstrap.servers": bootstrap, "transactional.id": transactional_id, **extra}
        asyncio.run(write_async(db.removeprefix("async:"), config, topic, range(first, first + count),
                                kill_at=kill_at, mode=mode))
        return 0
    connection = connect(db)
    writer = DualWriter(connection, {"bootstrap.servers": bootstrap, "transactional.id": transactional_id, **extra})
    writer.recover()
    insert = "INSERT INTO orders (id, amount) VALUES (?, ?)" if db.startswith("sqlite:") else \
        "INSERT INTO orders (id, amount) VALUES (%s, %s)"
    write_orders(writer, connection, insert, topic, range(first, first + count), kill_at=kill_at, mode=mode)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
