"""The connections a dual writer accepts (DB-API, SQLAlchemy Connection/Engine/raw_connection) and its state table
on them, on SQLite (no broker needed)."""

from __future__ import annotations

import sqlite3

import pytest
import sqlalchemy
from sqlalchemy.orm import Session

from kafka2pc.dualwrite.blocking import perform, run
from kafka2pc.dualwrite.connection import DbapiConnection, SqlAlchemyConnection, adapt
from kafka2pc.dualwrite.state_table import StateTable, state_table_ddl
from kafka2pc.errors import ConfigError, UsageError


def test_an_autocommit_connection_is_refused():
    class Autocommitting(sqlite3.Connection):
        autocommit = True

    with pytest.raises(ConfigError, match="autocommit"):
        table = StateTable(adapt(sqlite3.connect(":memory:", factory=Autocommitting)), "state")
        run(table.begin_locked("id-0"), table.connection)


def test_sqlalchemys_raw_connection_is_recognised_as_sqlite(tmp_path):
    """engine.raw_connection() wraps sqlite3's connection in SQLAlchemy's proxy: still SQLite (BEGIN IMMEDIATE,
    '?' placeholders, no FOR UPDATE)."""
    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    raw = engine.raw_connection()
    connection = adapt(raw)
    assert type(connection) is DbapiConnection and connection.sqlite
    table = StateTable(connection, "state")
    assert run(table.begin_locked("id-0"), connection).owner is None
    connection.rollback()
    raw.close()


@pytest.mark.parametrize("given", ["engine", "connection"])
def test_sqlalchemy_connections_and_engines_go_through_sqlalchemy(tmp_path, given):
    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    sa_connection = engine.connect()
    connection = adapt(engine if given == "engine" else sa_connection)
    assert isinstance(connection, SqlAlchemyConnection) and connection.sqlite
    assert connection.owned == (given == "engine")
    table = StateTable(connection, "state")
    run(table.begin_locked("id-0"), connection)
    assert connection.sqlalchemy.in_transaction()  # SQLAlchemy knows of the transaction the writer began
    run(table.write("id-0", owner="me", completed=True), connection)
    connection.commit()
    assert not connection.sqlalchemy.in_transaction()
    assert run(table.read("id-0"), connection).owner == "me"
    connection.close()
    sa_connection.close()


def test_a_sqlalchemy_connection_with_a_transaction_open_is_refused(tmp_path):
    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    with engine.connect() as sa_connection:
        sa_connection.exec_driver_sql("SELECT 1")  # SQLAlchemy autobegins
        with pytest.raises(UsageError, match="open transaction") as raised:
            run(StateTable(adapt(sa_connection), "state").begin_locked("id-0"), adapt(sa_connection))
        assert not isinstance(raised.value, ConfigError)  # a call-order misuse, not bad configuration


def test_an_autocommit_engine_and_an_orm_session_are_refused(tmp_path):
    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as sa_connection, \
            pytest.raises(ConfigError, match="AUTOCOMMIT"):
        run(StateTable(adapt(sa_connection), "state").begin_locked("id-0"), adapt(sa_connection))
    with Session(engine) as session, pytest.raises(ConfigError, match="Session"):
        adapt(session)
    with pytest.raises(ConfigError, match="not a DB-API"):
        adapt("sqlite:///app.db")


def test_the_state_table_is_made_only_when_missing_and_allowed(tmp_path):
    path = tmp_path / "app.db"
    connection = adapt(sqlite3.connect(path))
    with pytest.raises(ConfigError, match="CREATE TABLE IF NOT EXISTS state"):
        run(StateTable(connection, "state", create=False).begin_locked("id-0"), connection)
    assert not connection.in_transaction()
    run(StateTable(connection, "state").begin_locked("id-0"), connection)
    connection.commit()
    run(StateTable(connection, "state", create=False).begin_locked("id-0"), connection)  # exists now: only checked
    connection.rollback()


def test_the_ddl_names_only_plain_identifiers():
    assert state_table_ddl("my_state").startswith("CREATE TABLE IF NOT EXISTS my_state (")
    with pytest.raises(ConfigError, match="plain SQL identifier"):
        state_table_ddl("x; DROP TABLE orders")


@pytest.mark.parametrize("end", ["commit", "rollback"])
def test_the_block_savepoint_tells_an_ended_transaction(tmp_path, end):
    connection = adapt(sqlite3.connect(tmp_path / "app.db"))
    table = StateTable(connection, "state")
    run(table.begin_locked("id-0"), connection)
    perform(table.mark_block(), connection)
    assert not run(table.block_ended(), connection)
    perform(table.release_block(), connection)
    connection.rollback()
    run(table.begin_locked("id-0"), connection)
    perform(table.mark_block(), connection)
    getattr(connection, end)()  # the application ends the transaction inside the block
    connection.cursor().execute("INSERT INTO state (transactional_id) VALUES ('other')")
    with pytest.raises(sqlite3.OperationalError, match="no such savepoint"):
        perform(table.release_block(), connection)
    assert run(table.block_ended(), connection)
    connection.rollback()
