"""On a cluster with SASL/PLAIN and ACLs, a missing ACL gives an AuthorizationError that names it."""

import uuid

import pytest
from kafka.protocol.admin.acl import CreateAclsRequest

from kafka2pc import PreparedTxnState, TransactionOutcome, TwoPhaseProducer
from kafka2pc.cluster import ClusterClient
from kafka2pc.config import ClientConfig
from kafka2pc.errors import AuthorizationError
from kafka2pc.testing import BrokerSettings
from kafka2pc.testing.verify import create_topic, read_records, values

pytestmark = pytest.mark.integration

TOPIC, CLUSTER, TRANSACTIONAL_ID = 2, 4, 5                       # resource types
WRITE, DESCRIBE, DESCRIBE_CONFIGS, TWO_PHASE_COMMIT = 4, 8, 10, 15  # operations (TWO_PHASE_COMMIT: KIP-939)
LITERAL, ALLOW = 3, 3


def grant(admin: ClusterClient, resource_type: int, name: str, *operations: int, user: str = "alice") -> None:
    creations = [CreateAclsRequest.AclCreation(
        resource_type=resource_type, resource_name=name, resource_pattern_type=LITERAL, principal=f"User:{user}",
        host="*", operation=operation, permission_type=ALLOW) for operation in operations]
    response = admin.send(CreateAclsRequest(creations=creations))
    assert all(r.error_code == 0 for r in response.results), response


@pytest.fixture(scope="module")
def secured(request):
    """One secured cluster (2PC on) for this module: user alice, ACLs granted per test."""
    from kafka2pc.testing.provider import choose_backend, start_kafka  # noqa: PLC0415

    if choose_backend() != "local":
        pytest.skip("needs the local backend (a secured cluster with chosen users)")
    service = start_kafka(BrokerSettings(sasl_users={"alice": "alice-secret"}), backend="local")
    admin = ClusterClient(ClientConfig.from_dict(service.client_config))
    topic = create_topic(service.client_config)
    grant(admin, TOPIC, topic, WRITE, DESCRIBE)
    yield service, admin, topic
    admin.close()
    service.close()


def alice(service, txn_id: str, *, two_phase_commit: bool = True) -> TwoPhaseProducer:
    config = {**service.settings.client_config(service.bootstrap_servers, "alice"), "transactional.id": txn_id}
    return TwoPhaseProducer(config, two_phase_commit=two_phase_commit)


def test_missing_write_on_the_transactional_id(secured):
    service, _, _ = secured
    with alice(service, f"t-{uuid.uuid4().hex[:6]}", two_phase_commit=False) as producer, \
            pytest.raises(AuthorizationError, match="grant WRITE on it"):
        producer.init_transactions()
    with alice(service, f"t-{uuid.uuid4().hex[:6]}") as producer, \
            pytest.raises(AuthorizationError, match="grant WRITE and TWO_PHASE_COMMIT on it"):
        producer.init_transactions()


def test_write_without_two_phase_commit_names_the_missing_acl(secured):
    service, admin, topic = secured
    txn_id = f"t-{uuid.uuid4().hex[:6]}"
    grant(admin, TRANSACTIONAL_ID, txn_id, WRITE)
    grant(admin, CLUSTER, "kafka-cluster", DESCRIBE_CONFIGS)
    with alice(service, txn_id) as producer, \
            pytest.raises(AuthorizationError, match="grant TWO_PHASE_COMMIT on it") as info:
        producer.init_transactions()
    assert "may write with transactional id" in str(info.value)  # WRITE is granted; only 2PC is missing
    with alice(service, txn_id, two_phase_commit=False) as producer:  # WRITE alone is enough without 2PC
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(topic, value=b"standard")
        producer.commit_transaction()
    assert b"standard" in values(read_records(service.client_config, topic))


def test_write_and_two_phase_commit_granted(secured):
    service, admin, topic = secured
    txn_id = f"t-{uuid.uuid4().hex[:6]}"
    grant(admin, TRANSACTIONAL_ID, txn_id, WRITE, TWO_PHASE_COMMIT)
    with alice(service, txn_id) as producer:
        producer.init_transactions()
        assert producer.two_phase_commit_active
        producer.begin_transaction()
        producer.produce(topic, value=b"two-phase")
        state = producer.prepare_transaction()
    with alice(service, txn_id) as recovering:
        assert recovering.init_transactions(keep_prepared_txn=True) == state
        assert recovering.complete_transaction(str(state)) is TransactionOutcome.COMMITTED
    assert b"two-phase" in values(read_records(service.client_config, topic))
    assert PreparedTxnState.parse(str(state)) == state
