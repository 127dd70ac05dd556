"""Issue 32, part 3: the output topic and the ACLs change under a running job, on real brokers.

- Partitions added to the output topic: the job stays exact (read_committed audit: 0 duplicates, 0 gaps, nothing
  pinned) and the new partitions get records from the first transaction begun once the producer's partition metadata
  is ``metadata.max.age.ms`` old; keyed records go to ``murmur2(key) % new count`` from then on.
- The output topic deleted: the error names the topic as deleted, the abort releases the transaction's other
  partitions (nothing pinned) and the producer goes on writing the other topic.
- WRITE revoked on a dual writer's transactional id: an AuthorizationError naming WRITE and the id; the open
  transaction stays open (nobody may end it) until the ACL is back, then the job resumes exactly.
- TWO_PHASE_COMMIT revoked: a running producer goes on (the broker checks it at InitProducerId); a recovering one is
  refused with an AuthorizationError naming TWO_PHASE_COMMIT and the id, without aborting the prepared transaction,
  which commits once the ACL is back; without DESCRIBE_CONFIGS on the cluster it falls back (a WARNING naming the ACL)
  and still commits it.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient, NewPartitions  # type: ignore[attr-defined]
from kafka.protocol.admin.acl import CreateAclsRequest, DeleteAclsRequest

from kafka2pc import PreparedTxnState, State, TransactionOutcome, TwoPhaseProducer
from kafka2pc._data.partitioner import key_partition
from kafka2pc.audit import RecordDecoder, audit_topic
from kafka2pc.cluster import ClusterClient
from kafka2pc.config import ClientConfig
from kafka2pc.config.librdkafka import librdkafka_settings
from kafka2pc.dualwrite import DualWriter
from kafka2pc.errors import AuthorizationError, Kafka2pcError, TransactionAbortableError
from kafka2pc.testing import BrokerSettings
from kafka2pc.testing.verify import create_topic, end_offsets, read_records

pytestmark = pytest.mark.integration

TOPIC, CLUSTER, TRANSACTIONAL_ID = 2, 4, 5                        # ACL resource types
WRITE, DESCRIBE, DESCRIBE_CONFIGS, TWO_PHASE_COMMIT = 4, 8, 10, 15  # ACL operations (TWO_PHASE_COMMIT: KIP-939)
LITERAL, ALLOW = 3, 3


def _admin(service) -> AdminClient:
    return AdminClient(librdkafka_settings(ClientConfig.from_dict(service.client_config)))


def _until(condition, within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _partition_count(admin: AdminClient, topic: str) -> int | None:
    meta = admin.list_topics(topic, timeout=5).topics.get(topic)
    if meta is None or meta.error is not None:
        return None
    return sum(p.leader >= 0 for p in meta.partitions.values())


def _event(record_id: int) -> tuple[bytes, bytes]:
    """(key, value) of the event with ``record_id``: the key is the id, the value JSON with it (the audit's)."""
    return str(record_id).encode(), json.dumps({"id": record_id}).encode()


def _produce(producer: TwoPhaseProducer, topic: str, record_id: int) -> None:
    key, value = _event(record_id)
    producer.produce(topic, value=value, key=key)


def _audit(service, topic: str, last_id: int):
    return audit_topic(service.client_config, topic, RecordDecoder(id_field="id"), expect_range=(0, last_id))


def _written(service, topic: str) -> int:
    """How many records (and markers) ``topic`` holds: the sum of its high watermarks."""
    return sum(end_offsets(service.client_config, topic, isolation="read_uncommitted").values())


def _pinned(service, topic: str) -> dict[int, tuple[int, int]]:
    """Partitions whose read_committed end (LSO) is behind the high watermark: (LSO, high watermark)."""
    lso = end_offsets(service.client_config, topic)
    high = end_offsets(service.client_config, topic, isolation="read_uncommitted")
    return {p: (lso[p], high[p]) for p in high if lso[p] < high[p]}


# -- partitions added ------------------------------------------------------------------------------------------------

def test_partitions_added_mid_job_get_keyed_records_and_the_job_stays_exact(kafka):
    """Before, a producer read a topic's partitions once for its lifetime: the partitions added here never got a
    record from it (measured: 0 records in the 3 new partitions after 4 more transactions), while a new producer
    would have used them."""
    topic = create_topic(kafka.client_config, partitions=2)
    admin = _admin(kafka)
    max_age_s = 1.0
    config = {**kafka.client_config, "transactional.id": f"grow-{uuid.uuid4().hex[:8]}",
              "metadata.max.age.ms": int(max_age_s * 1000)}
    began: list[tuple[float, range]] = []
    added_at = None
    next_id = 0
    with TwoPhaseProducer(config, two_phase_commit=True) as producer:
        producer.init_transactions()
        for number in range(14):
            ids = range(next_id, next_id + 50)
            next_id += 50
            began.append((time.monotonic(), ids))
            producer.begin_transaction()
            events = [_event(i) for i in ids]
            if number % 2:
                producer.produce_batch(topic, [v for _, v in events], [k for k, _ in events])
            else:
                for key, value in events:
                    producer.produce(topic, value=value, key=key)
            if number == 4:  # added while this transaction is open
                admin.create_partitions([NewPartitions(topic, 5)])[topic].result(timeout=30)
                _until(lambda: _partition_count(admin, topic) == 5, 30, "the new partitions' leaders")
                added_at = time.monotonic()
            state = producer.prepare_transaction()
            assert producer.complete_transaction(state) is TransactionOutcome.COMMITTED
            time.sleep(0.2)
    assert added_at is not None

    report = _audit(kafka, topic, next_id - 1)
    assert report.clean, report.verdict
    assert (report.records, report.duplicates, report.gaps, report.lso_pinned) == (next_id, 0, 0, ())

    partition_of = {int(r.key): r.partition for r in read_records(kafka.client_config, topic)}
    before = [ids for at, ids in began if at < added_at]
    after = [ids for at, ids in began if at >= added_at + max_age_s]
    assert len(before) == 5 and len(after) >= 5, (len(before), len(after))
    for ids in before:  # placed among 2 partitions
        assert all(partition_of[i] == key_partition(str(i).encode(), 2) for i in ids)
    for ids in after:   # among 5 from the first transaction begun once the metadata was metadata.max.age.ms old
        assert all(partition_of[i] == key_partition(str(i).encode(), 5) for i in ids)
    assert {partition_of[i] for ids in after for i in ids} == {0, 1, 2, 3, 4}


# -- the topic deleted -----------------------------------------------------------------------------------------------

def test_the_output_topic_deleted_mid_transaction_is_named_and_pins_nothing_else(kafka):
    """A transaction writing two topics; one is deleted under it. The error names the topic as deleted (before: 'it
    does not exist ... create it first', as for a topic never created), the abort ends the transaction at once and
    releases the other topic's partitions, and the producer goes on."""
    doomed = create_topic(kafka.client_config, partitions=2)
    kept = create_topic(kafka.client_config, partitions=2)
    admin = _admin(kafka)
    config = {**kafka.client_config, "transactional.id": f"deleted-{uuid.uuid4().hex[:8]}"}
    with TwoPhaseProducer(config, two_phase_commit=True) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(10):
            _produce(producer, doomed, i)
            _produce(producer, kept, i)
        assert producer.complete_transaction(producer.prepare_transaction()) is TransactionOutcome.COMMITTED

        producer.begin_transaction()
        for i in range(10, 20):
            _produce(producer, doomed, i)
            _produce(producer, kept, i)
        producer.flush()  # written: the kept topic's partitions are held by this open transaction
        assert _pinned(kafka, kept)
        admin.delete_topics([doomed])[doomed].result(timeout=30)
        _until(lambda: _partition_count(admin, doomed) is None, 30, "the deletion")
        for i in range(20, 30):
            _produce(producer, doomed, i)
            _produce(producer, kept, i)
        started = time.monotonic()
        with pytest.raises(TransactionAbortableError,
                           match=rf"topic '{doomed}' no longer exists: it was deleted after this producer began "
                                 "writing to it"):
            producer.prepare_transaction()
        assert time.monotonic() - started < 5  # not retried until delivery.timeout.ms
        assert producer.state is State.ABORTABLE_ERROR
        producer.abort_transaction()
        _until(lambda: not _pinned(kafka, kept), 10, "the kept topic's LSO")

        producer.begin_transaction()  # the job goes on without the deleted topic: ids 10..29 again, once
        for i in range(10, 30):
            _produce(producer, kept, i)
        assert producer.complete_transaction(producer.prepare_transaction()) is TransactionOutcome.COMMITTED

        producer.begin_transaction()  # and writing to it again says so at once
        with pytest.raises(TransactionAbortableError, match=rf"topic '{doomed}' no longer exists"):
            producer.produce(doomed, b"again")
            producer.flush()
        producer.abort_transaction()

    report = _audit(kafka, kept, 29)
    assert report.clean, report.verdict
    assert (report.records, report.duplicates, report.gaps, report.lso_pinned) == (30, 0, 0, ())


def test_a_prepared_transaction_whose_topic_is_deleted_commits_its_other_partitions(kafka):
    """The broker's side, measured: the coordinator skips the markers of partitions deleted since (it finds no
    leader), so the commit of a prepared transaction ends at once and its records in the other topic are visible."""
    doomed = create_topic(kafka.client_config, partitions=1)
    kept = create_topic(kafka.client_config, partitions=2)
    admin = _admin(kafka)
    config = {**kafka.client_config, "transactional.id": f"deleted-prep-{uuid.uuid4().hex[:8]}"}
    with TwoPhaseProducer(config, two_phase_commit=True) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(10):
            _produce(producer, doomed, i)
            _produce(producer, kept, i)
        state = producer.prepare_transaction()
        admin.delete_topics([doomed])[doomed].result(timeout=30)
        _until(lambda: _partition_count(admin, doomed) is None, 30, "the deletion")
        assert producer.complete_transaction(state) is TransactionOutcome.COMMITTED
    report = _audit(kafka, kept, 9)
    assert report.clean, report.verdict
    assert (report.records, report.lso_pinned) == (10, ())


# -- ACLs revoked ----------------------------------------------------------------------------------------------------

def _acl(admin: ClusterClient, resource_type: int, name: str, *operations: int, granted: bool) -> None:
    """Grant (or revoke) ``operations`` on a resource to User:alice; revoking waits until the broker refuses."""
    if granted:
        response = admin.send(CreateAclsRequest(creations=[CreateAclsRequest.AclCreation(
            resource_type=resource_type, resource_name=name, resource_pattern_type=LITERAL, principal="User:alice",
            host="*", operation=operation, permission_type=ALLOW) for operation in operations]))
        assert all(r.error_code == 0 for r in response.results), response
    else:
        response = admin.send(DeleteAclsRequest(filters=[DeleteAclsRequest.DeleteAclsFilter(
            resource_type_filter=resource_type, resource_name_filter=name, pattern_type_filter=LITERAL,
            principal_filter="User:alice", host_filter="*", operation=operation, permission_type=ALLOW)
            for operation in operations]))
        assert all(r.error_code == 0 for r in response.filter_results), response
    time.sleep(0.3)  # a single node applies an ACL change from its metadata log within milliseconds


@pytest.fixture(scope="module")
def secured() -> Iterator[tuple]:
    """One secured cluster (2PC on, SASL/PLAIN, ACLs) for this module's ACL tests: user alice."""
    from kafka2pc.testing.provider import choose_backend, start_kafka  # noqa: PLC0415

    if choose_backend() != "local":
        pytest.skip("needs the local backend (a secured cluster with chosen users)")
    service = start_kafka(BrokerSettings(sasl_users={"alice": "alice-secret"}), backend="local")
    admin = ClusterClient(ClientConfig.from_dict(service.client_config))
    try:
        yield service, admin
    finally:
        admin.close()
        service.close()


def _as_alice(service, txn_id: str, **extra) -> dict:
    return {**service.settings.client_config(service.bootstrap_servers, "alice"), "transactional.id": txn_id,
            **extra}


def test_write_revoked_on_a_dual_writers_id_is_named_and_the_job_resumes_exactly(secured, tmp_path):
    """A DualWriter job (SQLite rows + events, two per row). WRITE on its transactional id is revoked while a
    transaction has records on the broker: the error names WRITE and the id, the open transaction holds its
    partition (nobody may end it now), and every retry fails the same way, with the ACL named. Once the ACL is back,
    the writer's next transaction() aborts the open one and the job goes on: every row once, every event once,
    nothing pinned."""
    service, admin = secured
    topic = create_topic(service.client_config, partitions=2)
    _acl(admin, TOPIC, topic, WRITE, DESCRIBE, granted=True)
    txn_id = f"dw-acl-{uuid.uuid4().hex[:8]}"
    _acl(admin, TRANSACTIONAL_ID, txn_id, WRITE, TWO_PHASE_COMMIT, granted=True)
    database = sqlite3.connect(tmp_path / "orders.db")
    database.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
    database.commit()
    rows, errors, pinned_while_revoked = 12, [], {}
    writer = DualWriter(database, _as_alice(service, txn_id, **{"linger.ms": 0}))
    try:
        row = attempts = 0
        while row < rows and attempts < 40:  # bounded
            attempts += 1
            try:
                with writer.transaction() as tx:
                    tx.cursor.execute("INSERT INTO orders VALUES (?)", (row,))
                    revoke = row == 5 and not errors
                    high = _written(service, topic) if revoke else 0
                    key, value = _event(2 * row)
                    tx.produce(topic, value, key)
                    if revoke:  # once its first event is on the broker (linger.ms=0: sent at once)
                        _until(lambda h=high: _written(service, topic) > h, 10, "the first event on the broker")
                        _acl(admin, TRANSACTIONAL_ID, txn_id, WRITE, granted=False)
                    key, value = _event(2 * row + 1)
                    tx.produce(topic, value, key)
                row += 1
            except Kafka2pcError as exc:
                errors.append(exc)
                if len(errors) == 1:
                    pinned_while_revoked = _pinned(service, topic)
                if len(errors) == 3:
                    _acl(admin, TRANSACTIONAL_ID, txn_id, WRITE, granted=True)
    finally:
        writer.close()

    assert len(errors) == 3, errors
    assert all(isinstance(e, AuthorizationError) for e in errors), errors
    assert all(repr(txn_id) in str(e) for e in errors), errors
    assert "grant WRITE on it" in str(errors[0]), errors[0]   # the write refused
    assert all("grant" in str(e) for e in errors[1:]), errors  # its recovery refused, the ACL named
    assert pinned_while_revoked, "the open transaction should hold its partition while nobody may end it"
    assert [r[0] for r in database.execute("SELECT id FROM orders ORDER BY id")] == list(range(rows))
    report = _audit(service, topic, 2 * rows - 1)
    assert report.clean, report.verdict
    assert (report.records, report.duplicates, report.gaps, report.lso_pinned) == (2 * rows, 0, 0, ())


def _revoked_while_prepared(service, admin: ClusterClient, topic: str, txn_id: str) -> PreparedTxnState:
    """A producer commits ids 0..9 and prepares 10..19; TWO_PHASE_COMMIT is revoked between its prepares (it goes
    on: the broker checks the ACL at InitProducerId only); then its process dies, the second one left prepared."""
    running = TwoPhaseProducer(_as_alice(service, txn_id), two_phase_commit=True)
    running.init_transactions()
    assert running.two_phase_commit_active
    running.begin_transaction()
    for i in range(10):
        _produce(running, topic, i)
    first = running.prepare_transaction()
    _acl(admin, TRANSACTIONAL_ID, txn_id, TWO_PHASE_COMMIT, granted=False)
    assert running.complete_transaction(first) is TransactionOutcome.COMMITTED
    running.begin_transaction()
    for i in range(10, 20):
        _produce(running, topic, i)
    second = running.prepare_transaction()
    running.close()  # the process dies: its prepared transaction stays open for its successor
    return second


@pytest.mark.parametrize("describe_configs", [True, False], ids=["configs-readable", "configs-unreadable"])
def test_two_phase_commit_revoked_keeps_the_prepared_transaction_and_names_the_acl(secured, caplog,
                                                                                  describe_configs):
    """TWO_PHASE_COMMIT revoked on an id while a producer has a transaction prepared. The running producer is not
    affected. A recovering producer (its process died) is refused, naming TWO_PHASE_COMMIT and the id, and the
    prepared transaction is kept, not aborted; once the ACL is back, recovery commits it. When the principal cannot
    read the broker's config (no DESCRIBE_CONFIGS on the cluster), refused Enable2Pc cannot be told from 2PC turned
    off: the producer falls back with a WARNING naming the ACL and the id, and still completes the kept
    transaction."""
    service, admin = secured
    topic = create_topic(service.client_config, partitions=2)
    _acl(admin, TOPIC, topic, WRITE, DESCRIBE, granted=True)
    txn_id = f"tpc-acl-{uuid.uuid4().hex[:8]}"
    _acl(admin, TRANSACTIONAL_ID, txn_id, WRITE, TWO_PHASE_COMMIT, granted=True)
    _acl(admin, CLUSTER, "kafka-cluster", DESCRIBE_CONFIGS, granted=describe_configs)
    try:
        second = _revoked_while_prepared(service, admin, topic, txn_id)
        with TwoPhaseProducer(_as_alice(service, txn_id), two_phase_commit=True) as successor:
            if describe_configs:
                with pytest.raises(AuthorizationError, match="TWO_PHASE_COMMIT") as refused:
                    successor.init_transactions(keep_prepared_txn=True)
                assert repr(txn_id) in str(refused.value)
                assert _pinned(service, topic)  # kept: still prepared, not aborted
            else:
                with caplog.at_level(logging.WARNING, logger="kafka2pc.producer"):
                    assert successor.init_transactions(keep_prepared_txn=True) == second
                warning = " ".join(r.getMessage() for r in caplog.records if r.name == "kafka2pc.producer")
                assert "TWO_PHASE_COMMIT" in warning and repr(txn_id) in warning, warning
                assert not successor.two_phase_commit_active
                assert successor.complete_transaction(second) is TransactionOutcome.COMMITTED
        _acl(admin, TRANSACTIONAL_ID, txn_id, TWO_PHASE_COMMIT, granted=True)

        with TwoPhaseProducer(_as_alice(service, txn_id), two_phase_commit=True) as restored:
            kept = restored.init_transactions(keep_prepared_txn=True)
            assert kept == (second if describe_configs else None)
            if kept is not None:
                assert restored.complete_transaction(kept) is TransactionOutcome.COMMITTED
            assert restored.two_phase_commit_active
            restored.begin_transaction()
            for i in range(20, 30):
                _produce(restored, topic, i)
            assert restored.complete_transaction(restored.prepare_transaction()) is TransactionOutcome.COMMITTED
    finally:
        _acl(admin, CLUSTER, "kafka-cluster", DESCRIBE_CONFIGS, granted=False)
    report = _audit(service, topic, 29)
    assert report.clean, report.verdict
    assert (report.records, report.duplicates, report.gaps, report.lso_pinned) == (30, 0, 0, ())
