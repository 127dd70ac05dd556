"""A dual writer on Django's own database connection, through Django's transaction management
(docs/dual-write-django.md).

Each of the writer's transactions is a durable ``transaction.atomic()`` block on the alias, so Django knows of it:
the ORM's queries inside the block run in it, Django's own checks refuse ``transaction.commit()`` inside it before
anything commits, and the block's end is the atomic block's end. The connection is resolved on every use, so a
writer lent to a thread works on that thread's connection (Django's connections are per thread)."""

from __future__ import annotations

import sys
from typing import Any

from kafka2pc.dualwrite.connection import DbapiConnection, is_closed
from kafka2pc.errors import ConfigError, DualWriteUsageError


def is_django_connection(connection: Any) -> bool:
    """Whether ``connection`` is ``django.db.connection``, ``django.db.connections[alias]``, or this adapter."""
    if isinstance(connection, DjangoConnection):
        return True
    base = sys.modules.get("django.db.backends.base.base")
    proxies = sys.modules.get("django.utils.connection")
    return bool((base is not None and isinstance(connection, base.BaseDatabaseWrapper))
                or (proxies is not None and isinstance(connection, proxies.ConnectionProxy)))


class DjangoConnection(DbapiConnection):
    """Django's connection for ``alias``, as a dual writer uses it (PostgreSQL only, for now)."""

    def __init__(self, alias: str = "default"):
        from django.db import connections, utils  # noqa: PLC0415 - Django is optional

        self._connections = connections
        self.alias = alias
        vendor = connections[alias].vendor
        if vendor != "postgresql":
            raise ConfigError("connection", f"is Django's {vendor!r} backend: the dual writer works on Django's "
                                            "PostgreSQL backend (on MySQL and SQLite, pass a DB-API connection)")
        # Django wraps the driver's errors in its own classes (the driver's as __cause__): those are the ones raised
        self.module = utils
        self.sqlite, self.mysql = False, False
        self._atomic: Any = None
        self._block = None

    @classmethod
    def of(cls, connection: Any) -> DjangoConnection:
        """The adapter for ``django.db.connection`` or a ``connections[alias]``."""
        if isinstance(connection, DjangoConnection):
            return connection
        alias = getattr(connection, "alias", None) or getattr(connection, "_alias", None) or "default"
        return cls(str(alias))

    @property
    def given(self) -> Any:
        """This thread's Django connection for the alias."""
        return self._connections[self.alias]

    @given.setter
    def given(self, value: Any) -> None:  # DbapiConnection's __init__ sets it; Django's is always resolved
        pass

    @property
    def dbapi(self) -> Any:
        return self.given.connection

    @property
    def paramstyle(self) -> str:
        return "format"  # Django's cursors take %s on every backend

    def lost(self) -> bool:
        driver = self.given.connection
        return driver is None or is_closed(driver)

    def begin(self) -> None:
        from django.db import transaction  # noqa: PLC0415

        connection = self.given
        if connection.in_atomic_block:
            raise DualWriteUsageError(self.why_in_transaction())
        _close_if_unusable(connection)  # a connection broken earlier: Django reconnects
        atomic = transaction.Atomic(self.alias, savepoint=True, durable=True)
        atomic.__enter__()
        self._atomic = atomic

    def commit(self) -> None:
        atomic, self._atomic = self._atomic, None
        if atomic is None:
            return
        if self.given.needs_rollback:  # Django's exit would roll back quietly: the commit did not happen
            atomic.__exit__(None, None, None)
            raise DualWriteUsageError("Django had marked the transaction for rollback (set_rollback, or a failed "
                                      "statement inside atomic(savepoint=False)): rolled back, not committed")
        atomic.__exit__(None, None, None)  # Django commits; on an error it rolls back and raises

    def rollback(self) -> None:
        atomic, self._atomic = self._atomic, None
        if atomic is not None:
            self.given.needs_rollback = True
            atomic.__exit__(None, None, None)

    def cursor(self) -> Any:
        return self.given.cursor()

    def in_transaction(self) -> bool:
        connection = self.given
        return bool(connection.in_atomic_block or not connection.get_autocommit())

    def why_in_transaction(self) -> str:
        blocks = self.given.atomic_blocks
        if blocks and getattr(blocks[0], "_from_testcase", False):
            return ("a dual write inside Django's TestCase: its transaction is never committed while Kafka's would "
                    "be. Use TransactionTestCase for tests of dual writes")
        return ("a dual write inside a transaction.atomic() block (or a view under ATOMIC_REQUESTS=True): the outer "
                "block would commit the rows after Kafka. Call it outside any atomic block; decorate such a view "
                "with @transaction.non_atomic_requests")

    def check_not_autocommit(self) -> None:
        """Django runs in autocommit between atomic blocks: the writer's own atomic block makes the transaction."""

    def marked_for_rollback(self) -> bool:
        connection = self.given
        return bool(connection.in_atomic_block and connection.needs_rollback
                    and not connection.closed_in_transaction)

    def block_misuse(self) -> str | None:
        connection = self.given
        if connection.needs_rollback:
            return ("transaction.set_rollback(True), or an inner atomic(savepoint=False) that failed, inside the "
                    "block: raise an exception to roll a dual write back")
        if connection.run_on_commit:
            return ("transaction.on_commit() inside the block: its callback would run at the database's commit, "
                    "before Kafka's transaction completes. Do that work after the block")
        return None

    def close(self) -> None:
        """Nothing: Django owns its connections (and closes them at each request's end)."""


def _close_if_unusable(connection: Any) -> None:
    """Django's ``close_if_unusable_or_obsolete`` without "obsolete": with ``CONN_MAX_AGE = 0`` (Django's default)
    that closes the connection at every call, and each dual write would connect anew (a third of its time, profiled
    in docs/dual-write-django.md). The age of a connection stays Django's, at each request's start and end."""
    if connection.connection is None:
        return
    if connection.get_autocommit() != connection.settings_dict["AUTOCOMMIT"]:
        connection.close()  # the application left autocommit changed: Django's own rule, no chances taken
    elif connection.errors_occurred:
        if connection.is_usable():
            connection.errors_occurred = False
        else:
            connection.close()
