"""Issue 32: the client's metadata follows a node of a 3-node cluster that was killed and came back.

While a node is down and fenced, a metadata answer lists only the others, and kafka-python's cluster metadata drops it
(its broker map is replaced by each answer). Before the fix nothing refreshed it when it came back: a listing that was
waiting on it kept failing with UnknownBrokerIdError for its whole timeout (60 s, then IncompleteListingError), and a
coordinator request to it failed the same way, though the cluster had the node back within a second. Now a listing
waiting on a node that left the metadata lists again from the coordinators' new leaders.
"""

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

import pytest
from kafka.admin import KafkaAdminClient

from kafka2pc._wire.kafka_settings import kafka_python_kwargs
from kafka2pc._wire.listing import list_transactions
from kafka2pc.cluster import ClusterClient
from kafka2pc.config import ClientConfig
from kafka2pc.transaction_control import TransactionControl
from tests.integration.txn_helpers import transactional_producer

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

_TRANSACTION_STATE = "__transaction_state"
#: how soon after the cluster has the node back (wait_ready returned) the client must work with it again
_WITHIN_S = 5.0


def _elect_preferred_leaders(kafka) -> None:
    """Coordinator partitions led by their preferred replicas (what the controller's imbalance check does within 5
    minutes), through a client of its own."""
    admin = KafkaAdminClient(**kafka_python_kwargs(ClientConfig.from_dict(kafka.client_config)),
                             client_id="node-return-test")
    try:
        admin.elect_leaders(0, [_TRANSACTION_STATE], timeout_ms=30_000, raise_errors=False)
    finally:
        admin.close()


def _coordinator_seen_by_a_new_client(kafka, transactional_id: str) -> int:
    with ClusterClient(ClientConfig.for_bootstrap(kafka.bootstrap_servers)) as probe:
        return probe.transaction_coordinator(transactional_id)


def _until(condition, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


class _Listing(threading.Thread):
    """A listing on the test's client, started while the node is down: its transactional ids or its error, and when
    it returned."""

    def __init__(self, client: ClusterClient):
        super().__init__(daemon=True)
        self.client = client
        self.ids: list[str] = []
        self.error: Exception | None = None
        self.returned_at = 0.0

    def run(self) -> None:
        try:
            self.ids = [t.transactional_id for t in list_transactions(self.client, timeout_s=60)]
        except Exception as exc:  # reported by the test
            self.error = exc
        self.returned_at = time.monotonic()


def _describe(control: TransactionControl, transactional_id: str) -> tuple[object, float]:
    """DescribeTransactions: what it saw, or its error, and how long it took."""
    started = time.monotonic()
    try:
        observed: object = control.describe(transactional_id)
    except Exception as exc:  # reported by the test
        observed = exc
    return observed, time.monotonic() - started


@contextlib.contextmanager
def _open_transaction(kafka, topic: str, transactional_id: str) -> Iterator[None]:
    producer = transactional_producer(kafka.bootstrap_servers, transactional_id, acks="all")
    producer.begin_transaction()
    producer.produce(topic, value=b"open")
    assert producer.flush(30) == 0
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            producer.abort_transaction(30)


def test_listing_and_coordinator_requests_follow_a_node_that_comes_back(kafka_3node, topic_factory, caplog,
                                                                        record_property):
    topic, txn_id = topic_factory(kafka_3node, partitions=1, replication_factor=3), "node-return"
    caplog.set_level(logging.DEBUG, logger="kafka2pc._wire.retrying")
    with _open_transaction(kafka_3node, topic, txn_id), \
            ClusterClient(ClientConfig.for_bootstrap(kafka_3node.bootstrap_servers)) as client:
        _elect_preferred_leaders(kafka_3node)  # earlier tests may have moved coordinators
        victim = client.transaction_coordinator(txn_id, refresh=True)
        assert txn_id in [t.transactional_id for t in list_transactions(client, timeout_s=10)]
        listing = _Listing(client)
        kafka_3node.kill_node(victim)
        try:
            down_at = time.monotonic()
            listing.start()  # before the node is fenced: it still leads coordinator partitions, the listing waits on it
            # the client sees the node go: a metadata answer without it (fenced after broker.session.timeout.ms)
            _until(lambda: bool(client.partition_leaders(topic)) and victim not in client.broker_ids(), 30)
            # the listing either starts a new round once the node left the metadata (its coordinators moved) or
            # is still waiting on it: either way it must end complete, at the latest soon after the node is back
        finally:
            kafka_3node.start_node(victim)
            kafka_3node.wait_ready()
        back_at = time.monotonic()
        try:
            # its coordinator partitions return to the node (checked with another client: this one's metadata is
            # left as it is); then a coordinator request to it
            _until(lambda: _elect_preferred_leaders(kafka_3node) or
                   _coordinator_seen_by_a_new_client(kafka_3node, txn_id) == victim, 30)
            observed, describe_s = _describe(TransactionControl(client, timeout_s=20), txn_id)
            coordinator = client.transaction_coordinator(txn_id)
            listing.join(70)
            assert not listing.is_alive()
            fresh = time.monotonic()
            fresh_ids = [t.transactional_id for t in list_transactions(client, timeout_s=60)]
            fresh_s = time.monotonic() - fresh
        finally:
            _elect_preferred_leaders(kafka_3node)

    waited = [message for message in (r.getMessage() for r in caplog.records)
              if message.startswith(f"ListTransactions on broker {victim}:")]
    figures = (f"node {victim} down {back_at - down_at:.1f} s; from wait_ready() returning: the listing started while "
               f"it was down returned after {listing.returned_at - back_at:+.2f} s (it waited on the node "
               f"{len(waited)} times, last: {waited[-1] if waited else None}); DescribeTransactions of an id it "
               f"coordinates again took {describe_s:.2f} s; a fresh listing {fresh_s:.2f} s")
    print(figures)
    record_property("ci_summary", figures)
    assert waited, "the listing never waited on the killed node: the scenario did not happen"
    assert listing.error is None, f"{figures}; the listing failed: {listing.error!r}"
    assert txn_id in listing.ids and txn_id in fresh_ids
    assert listing.returned_at - back_at < _WITHIN_S, figures
    assert not isinstance(observed, Exception), f"{figures}; DescribeTransactions failed: {observed!r}"
    assert getattr(observed, "state", None) == "Ongoing", observed
    assert coordinator == victim, "the coordinator did not return to the node: its requests were not tested"
    assert describe_s < _WITHIN_S, figures
