"""DualWriter with connections as applications hold them, on SQLite files and a real PostgreSQL server: the
application's own commit()/rollback() inside a block, nested blocks, work pending when the writer is made, a
least-privilege role, a state table made by a migration, and a failed lock followed by a retry."""

from __future__ import annotations

import glob
import os
import shutil
import sqlite3
import subprocess
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from kafka2pc.dualwrite import DualWriter, DualWriterPool, state_table_ddl
from kafka2pc.errors import ConfigError, DualWriteUsageError, UsageError
from tests.integration import test_dual_write
from tests.integration.test_dual_write import Database, kafka_keys, writer_for

database = test_dual_write.database  # the fixture: each test on a SQLite file and on a PostgreSQL schema

psycopg = pytest.importorskip("psycopg")
pytestmark = pytest.mark.integration


def insert_sql(db: Database) -> str:
    return db.sql("INSERT INTO orders (id, amount) VALUES (?, ?)")


def refused_or_caught(database: Database) -> Any:
    """What the application's commit or rollback inside the block ends with: psycopg refuses it before it does
    anything (the block's savepoint is psycopg's own transaction context); sqlite3's goes through, and the block's
    end finds its savepoint gone."""
    if database.url.startswith("sqlite:"):
        return pytest.raises(DualWriteUsageError, match="committed or rolled back inside")
    return pytest.raises(psycopg.ProgrammingError, match="forbidden within a Transaction context")


@pytest.mark.parametrize("then", ["goes on", "raises"])
def test_an_application_commit_inside_the_block_ends_it_with_an_error(database, kafka, topic_factory, then):
    bootstrap, topic = kafka.bootstrap_servers, topic_factory(kafka)
    writer, connection = writer_for(database, bootstrap)
    with refused_or_caught(database), writer.transaction() as tx:
        tx.cursor.execute(insert_sql(database), (1, 1))
        tx.produce(topic, value=b"1", key=b"1")
        connection.commit()  # a helper or an ORM commits mid-block
        tx.cursor.execute(insert_sql(database), (2, 2))
        tx.produce(topic, value=b"2", key=b"2")
        if then == "raises":
            raise RuntimeError("the request failed after the helper's commit")
    # sqlite3: the helper's commit stays (the error says so); the rest of the block and Kafka's transaction are rolled
    # back. psycopg: the commit was refused, nothing is split
    committed_inside = [1] if database.url.startswith("sqlite:") else []
    assert database.ids() == committed_inside and kafka_keys(bootstrap, topic) == []
    with writer.transaction() as tx:  # the writer carries on
        tx.cursor.execute(insert_sql(database), (3, 3))
        tx.produce(topic, value=b"3", key=b"3")
    writer.close()
    assert database.ids() == [*committed_inside, 3] and kafka_keys(bootstrap, topic) == [3]


def test_an_application_rollback_inside_the_block_ends_it_with_an_error(database, kafka, topic_factory):
    """After an IntegrityError the application rolls back and carries on: without the check, Kafka would commit the
    events of rows the database rolled back (and the state row's lock is gone)."""
    bootstrap, topic = kafka.bootstrap_servers, topic_factory(kafka)
    writer, connection = writer_for(database, bootstrap)
    with writer.transaction() as tx:
        tx.cursor.execute(insert_sql(database), (1, 1))
        tx.produce(topic, value=b"1", key=b"1")
    with refused_or_caught(database), writer.transaction() as tx:
        tx.cursor.execute(insert_sql(database), (2, 2))
        tx.produce(topic, value=b"2", key=b"2")
        try:
            tx.cursor.execute(insert_sql(database), (1, 1))
        except (sqlite3.IntegrityError, psycopg.errors.UniqueViolation):
            connection.rollback()
        tx.cursor.execute(insert_sql(database), (3, 3))
        tx.produce(topic, value=b"3", key=b"3")
    writer.close()
    assert database.ids() == kafka_keys(bootstrap, topic) == [1]


def test_a_savepoint_the_application_takes_inside_the_block_is_fine(database, kafka, topic_factory):
    bootstrap, topic = kafka.bootstrap_servers, topic_factory(kafka)
    writer, _ = writer_for(database, bootstrap)
    with writer.transaction() as tx:
        tx.cursor.execute(insert_sql(database), (1, 1))
        tx.cursor.execute("SAVEPOINT app")
        tx.cursor.execute(insert_sql(database), (2, 2))
        tx.cursor.execute("ROLLBACK TO SAVEPOINT app")
        tx.produce(topic, value=b"1", key=b"1")
    writer.close()
    assert database.ids() == kafka_keys(bootstrap, topic) == [1]


def test_a_nested_block_is_a_clear_error_and_the_outer_one_rolls_back(database, kafka, topic_factory):
    bootstrap, topic = kafka.bootstrap_servers, topic_factory(kafka)
    writer, _ = writer_for(database, bootstrap)
    with pytest.raises(DualWriteUsageError, match="inside another transaction"), writer.transaction() as tx:
        tx.cursor.execute(insert_sql(database), (1, 1))
        tx.produce(topic, value=b"1", key=b"1")
        with writer.transaction():
            pass
    with writer.transaction() as tx:
        tx.cursor.execute(insert_sql(database), (2, 2))
        tx.produce(topic, value=b"2", key=b"2")
    writer.close()
    assert database.ids() == kafka_keys(bootstrap, topic) == [2]


def test_making_a_writer_commits_none_of_the_callers_pending_work(database, kafka):
    connection = database.connect()
    connection.cursor().execute(insert_sql(database), (1, 1))  # the caller's uncommitted work
    writer = DualWriter(connection, {"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": "pending-0"})
    connection.rollback()
    assert database.ids() == []
    connection.cursor().execute(insert_sql(database), (2, 2))
    with pytest.raises(UsageError, match="open transaction"):  # and a recovery refuses to commit it either
        writer.recover()
    connection.rollback()
    writer.recover()
    writer.close()
    connection.close()
    assert database.ids() == []


def test_a_missing_state_table_with_create_state_table_false_names_the_ddl(database, kafka):
    connection = database.connect()
    writer = DualWriter(connection, {"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": "ddl-0"},
                        state_table="made_by_migration", create_state_table=False)
    with pytest.raises(ConfigError, match="CREATE TABLE IF NOT EXISTS made_by_migration"):
        writer.recover()
    connection.cursor().execute(state_table_ddl("made_by_migration"))  # the migration
    connection.commit()
    writer.recover()
    writer.close()
    connection.close()


def test_a_role_with_select_insert_update_only_writes(postgres_dsn, kafka, topic_factory):
    bootstrap, topic = kafka.bootstrap_servers, topic_factory(kafka)
    schema, role = f"s_{uuid.uuid4().hex[:10]}", f"app_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
        admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute(f"SET search_path = {schema}")
        admin.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, amount INTEGER NOT NULL)")
        admin.execute(state_table_ddl())
        admin.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        admin.execute(f"GRANT SELECT, INSERT, UPDATE ON orders, kafka2pc_dual_write_state TO {role}")
    connection = psycopg.connect(psycopg.conninfo.make_conninfo(postgres_dsn, user=role,
                                                                options=f"-c search_path={schema}"))
    with pytest.raises(psycopg.errors.InsufficientPrivilege):  # the role really cannot create tables
        connection.execute("CREATE TABLE probe (id INTEGER)")
    connection.rollback()
    writer = DualWriter(connection, {"bootstrap.servers": bootstrap, "transactional.id": f"least-{role}"})
    writer.recover()
    with writer.transaction() as tx:
        tx.cursor.execute("INSERT INTO orders (id, amount) VALUES (%s, %s)", (1, 1))
        tx.produce(topic, value=b"1", key=b"1")
    writer.close()
    connection.close()
    assert kafka_keys(bootstrap, topic) == [1]


def hold_row_lock(db: Database, transactional_id: str):
    """Another connection holding the id's state row (as a live writer with the same id would)."""
    holder = db.connect()
    cursor = holder.cursor()
    if isinstance(holder, sqlite3.Connection):
        cursor.execute("BEGIN IMMEDIATE")
    else:
        cursor.execute("SELECT 1 FROM kafka2pc_dual_write_state WHERE transactional_id = %s FOR UPDATE",
                       (transactional_id,))
    return holder


def test_a_failed_lock_raises_the_databases_error_and_a_retry_works(database, kafka, topic_factory):
    bootstrap, topic = kafka.bootstrap_servers, topic_factory(kafka)
    writer, connection = writer_for(database, bootstrap)
    if isinstance(connection, sqlite3.Connection):
        connection.execute("PRAGMA busy_timeout = 200")
        lock_error: type[Exception] = sqlite3.OperationalError
    else:
        connection.execute("SET lock_timeout = '200ms'")
        connection.commit()
        lock_error = psycopg.errors.LockNotAvailable
    holder = hold_row_lock(database, writer.transactional_id)
    with pytest.raises(lock_error), writer.transaction():
        pytest.fail("the block ran without the lock")
    holder.rollback()
    holder.close()
    with writer.transaction() as tx:  # the documented retry
        tx.cursor.execute(insert_sql(database), (1, 1))
        tx.produce(topic, value=b"1", key=b"1")
    writer.close()
    assert database.ids() == kafka_keys(bootstrap, topic) == [1]


def python_312_or_later() -> str | None:
    """An interpreter of Python 3.12+ on this machine (sqlite3's autocommit attribute arrived in 3.12)."""
    pyenv = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[2-9]*/bin/python3")))
    candidates = [os.environ.get("KAFKA2PC_PYTHON312", ""), shutil.which("python3.13") or "",
                  shutil.which("python3.12") or "", *pyenv]
    for candidate in filter(None, candidates):
        probe = subprocess.run([candidate, "-c", "import sqlite3, sys; sys.exit(sys.version_info < (3, 12))"],
                               capture_output=True, check=False)
        if probe.returncode == 0:
            return candidate
    return None


AUTOCOMMIT_FALSE_JOB = """
import sqlite3, sys
from kafka2pc.dualwrite import DualWriter
path, bootstrap, topic = sys.argv[1:4]
connection = sqlite3.connect(path, autocommit=False)  # PEP 249: a transaction is always open
assert connection.in_transaction
writer = DualWriter(connection, {"bootstrap.servers": bootstrap, "transactional.id": "autocommit-false-0"})
writer.recover()
for order in (1, 2, 3):
    with writer.transaction() as tx:
        tx.cursor.execute("INSERT INTO orders (id, amount) VALUES (?, ?)", (order, order))
        tx.produce(topic, value=b"%d" % order, key=b"%d" % order)
writer.close()
"""


def test_sqlite3_with_autocommit_false_writes(tmp_path, kafka, topic_factory):
    """Python 3.12's ``sqlite3.connect(..., autocommit=False)``: run in a venv of a 3.12+ interpreter (this suite's
    is 3.11), made once in .venv-py312 with kafka2pc's own dependencies."""
    python = python_312_or_later()
    if python is None:
        pytest.skip("no Python 3.12+ interpreter here (KAFKA2PC_PYTHON312 names one)")
    venv = Path(__file__).resolve().parents[2] / ".venv-py312"
    if not (venv / ".installed").exists():
        subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=120)
        subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "-e", str(venv.parent)], check=True,
                       timeout=600)
        (venv / ".installed").touch()
    bootstrap, topic = kafka.bootstrap_servers, topic_factory(kafka)
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as setup:
        setup.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, amount INTEGER NOT NULL)")
    job = subprocess.run([str(venv / "bin" / "python"), "-c", AUTOCOMMIT_FALSE_JOB, str(path), bootstrap, topic],
                         capture_output=True, text=True, timeout=120, check=False)
    assert job.returncode == 0, job.stderr[-3000:]
    with sqlite3.connect(path) as check:
        ids = [row[0] for row in check.execute("SELECT id FROM orders ORDER BY id")]
    assert ids == kafka_keys(bootstrap, topic) == [1, 2, 3]


def sqlalchemy_engine(db: Database) -> sqlalchemy.Engine:
    """An Engine on the test's database, its connections made the way the test's own are."""
    if db.url.startswith("sqlite:"):
        return sqlalchemy.create_engine(f"sqlite:///{db.url.removeprefix('sqlite:')}", pool_size=8)
    return sqlalchemy.create_engine("postgresql+psycopg://", creator=db.connect, pool_size=8)


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    amount: Mapped[int]


def test_a_sqlalchemy_engine_with_core_statements_and_an_orm_session_in_the_block(database, kafka, topic_factory):
    bootstrap, topic = kafka.bootstrap_servers, topic_factory(kafka)
    engine = sqlalchemy_engine(database)
    writer = DualWriter(engine, {"bootstrap.servers": bootstrap, "transactional.id": f"sa-{uuid.uuid4().hex[:6]}"})
    with writer.transaction() as tx:
        tx.connection.execute(sqlalchemy.text("INSERT INTO orders (id, amount) VALUES (:id, :amount)"),
                              {"id": 1, "amount": 1})
        tx.produce(topic, value=b"1", key=b"1")
    with writer.transaction() as tx:  # the ORM: a Session joined to the block's transaction through a savepoint
        with Session(bind=tx.connection, join_transaction_mode="create_savepoint") as session:
            session.add(Order(id=2, amount=2))
            session.commit()  # releases the Session's savepoint; the block still commits
        tx.produce(topic, value=b"2", key=b"2")
    with pytest.raises(DualWriteUsageError), writer.transaction() as tx:
        tx.connection.execute(sqlalchemy.text("INSERT INTO orders (id, amount) VALUES (3, 3)"))
        tx.produce(topic, value=b"3", key=b"3")
        tx.connection.commit()  # commit-as-you-go inside the block: refused at its end
    writer.close()
    engine.dispose()
    assert database.ids() == [1, 2, 3] and kafka_keys(bootstrap, topic) == [1, 2]


def test_a_pool_on_a_sqlalchemy_engine_serves_threads_at_once(database, kafka, topic_factory):
    bootstrap, topic = kafka.bootstrap_servers, topic_factory(kafka, partitions=3)
    engine = sqlalchemy_engine(database)
    pool = DualWriterPool(engine, {"bootstrap.servers": bootstrap, "transactional.id": f"web-{uuid.uuid4().hex[:6]}"},
                          size=4)
    failures: list[BaseException] = []

    def serve(offset: int) -> None:
        try:
            for order in range(offset, 40, 4):
                with pool.transaction() as tx:
                    tx.connection.execute(sqlalchemy.text("INSERT INTO orders (id, amount) VALUES (:id, 1)"),
                                          {"id": order})
                    tx.produce(topic, value=b"%d" % order, key=b"%d" % order)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=serve, args=(offset,)) for offset in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    pool.close()
    engine.dispose()
    assert failures == []
    assert database.ids() == kafka_keys(bootstrap, topic) == list(range(40))
