"""A producer whose prepared transaction another process ended goes on without an InitProducerId
(TwoPhaseProducer.continue_after_completion), on real brokers: under transaction protocol v2 (the newest release)
it does, and what it writes commits once; an InitProducerId since (another producer took the id over) stops it, and
one that comes after it went on fences it; under v1 (Apache Kafka 3.9.x) it never goes on."""

import pytest

from kafka2pc import PreparedTxnState
from kafka2pc.cluster import ClusterClient
from kafka2pc.config import ClientConfig
from kafka2pc.errors import ProducerFencedError
from kafka2pc.producer import State
from kafka2pc.testing.verify import read_records, values
from kafka2pc.transaction_control import TransactionControl
from tests.integration.producer_support import new_txn_id, producer

pytestmark = pytest.mark.integration


@pytest.fixture
def control(kafka):
    with ClusterClient(ClientConfig.for_bootstrap(kafka.bootstrap_servers)) as client:
        yield TransactionControl(client)


def _settled(control: TransactionControl, txn_id: str):
    """The id once its last end has written its markers (an EndTxn answers before: the look right after it shows
    PrepareCommit at the next epoch, which is not yet an end to go on from)."""
    return control.wait_until_settled(txn_id, within_s=10)


def _prepare(p, topic: str, value: bytes) -> PreparedTxnState:
    p.begin_transaction()
    p.produce(topic, value)
    return p.prepare_transaction()


def test_it_goes_on_at_the_epoch_the_committers_end_gave_and_commits_once(kafka, topic_factory, control):
    topic, txn_id = topic_factory(kafka), new_txn_id()
    with producer(kafka.bootstrap_servers, txn_id) as p:
        p.init_transactions()
        first = _prepare(p, topic, b"a")
        two_phase_timeout = control.describe_full(txn_id).timeout_ms
        with producer(kafka.bootstrap_servers, new_txn_id(), two_phase_commit=False) as plain:
            plain.init_transactions()
            _prepare(plain, topic, b"plain")
            assert control.describe_full(plain.transactional_id).timeout_ms != two_phase_timeout
            plain.abort_transaction()
        control.commit(txn_id, first)  # another process (the Spark driver) ends it: v2 bumps the epoch
        assert p.continue_after_completion(_settled(control, txn_id))
        assert p.state is State.READY and p.producer_id_and_epoch == (first.producer_id, first.epoch + 1)
        second = _prepare(p, topic, b"b")
        assert (second.producer_id, second.epoch) == (first.producer_id, first.epoch + 1)
        # the coordinator still runs it as a two-phase transaction (Enable2Pc was given once, at the init): no
        # timeout that would abort it before the committer's decision
        assert p.two_phase_commit_active
        assert control.describe_full(txn_id).timeout_ms == two_phase_timeout
        control.commit(txn_id, second)
        assert p.continue_after_completion(_settled(control, txn_id))
        third = _prepare(p, topic, b"c")
        control.abort(txn_id, third)  # an abort's end bumps too
        assert p.continue_after_completion(_settled(control, txn_id))
    assert values(read_records(kafka.bootstrap_servers, topic)) == [b"a", b"b"]


def test_after_another_producer_took_the_id_over_it_does_not_go_on(kafka, topic_factory, control):
    topic, txn_id = topic_factory(kafka), new_txn_id()
    with producer(kafka.bootstrap_servers, txn_id) as p, producer(kafka.bootstrap_servers, txn_id) as newcomer:
        p.init_transactions()
        control.commit(txn_id, _prepare(p, topic, b"a"))
        newcomer.init_transactions()  # a fresh InitProducerId: the id is Empty at the next epoch
        assert not p.continue_after_completion(_settled(control, txn_id))
        assert p.state is State.PREPARED
    assert values(read_records(kafka.bootstrap_servers, topic)) == [b"a"]


def test_one_that_went_on_is_fenced_by_a_later_producer_and_nothing_of_it_commits(kafka, topic_factory, control):
    topic, txn_id = topic_factory(kafka), new_txn_id()
    with producer(kafka.bootstrap_servers, txn_id) as p, producer(kafka.bootstrap_servers, txn_id) as newcomer:
        p.init_transactions()
        control.commit(txn_id, _prepare(p, topic, b"a"))
        assert p.continue_after_completion(_settled(control, txn_id))  # the look, then a newcomer before any write
        newcomer.init_transactions()
        p.begin_transaction()
        with pytest.raises(ProducerFencedError):
            p.produce(topic, b"zombie")
            p.flush()
        newcomer.begin_transaction()
        newcomer.produce(topic, b"newcomer")
        newcomer.commit_transaction()
    assert values(read_records(kafka.bootstrap_servers, topic)) == [b"a", b"newcomer"]


def test_under_transaction_protocol_v1_it_never_goes_on(kafka_pre2pc, topic_factory):
    topic, txn_id = topic_factory(kafka_pre2pc), new_txn_id()
    with ClusterClient(ClientConfig.for_bootstrap(kafka_pre2pc.bootstrap_servers)) as client, \
            producer(kafka_pre2pc.bootstrap_servers, txn_id) as p:
        control = TransactionControl(client)
        p.init_transactions()
        control.commit(txn_id, _prepare(p, topic, b"a"))
        assert not p.continue_after_completion(_settled(control, txn_id))
