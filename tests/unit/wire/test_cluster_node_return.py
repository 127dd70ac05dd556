"""Issue 32: a broker the client's metadata dropped while it was down is looked up afresh before a request to it.

kafka-python's real cluster metadata (:class:`kafka.cluster.ClusterMetadata`) under a fake connection manager that
answers Metadata from a script and refuses a request to a broker the metadata does not know, as
``KafkaConnectionManager.get_connection`` does (UnknownBrokerIdError, no refresh)."""

import asyncio
from types import SimpleNamespace

import kafka.errors as kafka_errors
import pytest
from kafka.cluster import ClusterMetadata
from kafka.future import Future
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from kafka2pc._core.retry import READS
from kafka2pc._wire.cluster_client import ClusterClient
from kafka2pc._wire.connection_lanes import ConnectionLanes


def _metadata(node_ids):
    brokers = [MetadataResponse.MetadataResponseBroker(version=12, node_id=n, host="127.0.0.1", port=9000 + n,
                                                       rack=None) for n in node_ids]
    return MetadataResponse(version=12, throttle_time_ms=0, brokers=brokers, cluster_id="c",
                            controller_id=node_ids[0], topics=[])


class Manager:
    """The connection manager's part ClusterClient and ClusterMetadata use. ``answers``: the brokers each Metadata
    answer lists, in turn (the last one repeats)."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.cluster = ClusterMetadata()
        self.cluster._manager = self  # attach() wants a network loop
        self.cluster.update_metadata(_metadata([1, 2, 3]))
        self.sent: list[tuple[str, int]] = []

    def least_loaded_node(self):
        return self.cluster.brokers()[0].node_id

    def reset_backoff(self, node_id):
        pass

    def send(self, request, node_id=None):
        node = self.least_loaded_node() if node_id is None else node_id
        if self.cluster.broker_metadata(node) is None:
            raise kafka_errors.UnknownBrokerIdError(node)  # as KafkaConnectionManager.get_connection
        self.sent.append((type(request).__name__, node))

        async def answer():
            if isinstance(request, MetadataRequest):
                return _metadata(self.answers.pop(0) if len(self.answers) > 1 else self.answers[0])
            return SimpleNamespace(answered_by=node)

        return answer()

    def run(self, coroutine_function):
        return asyncio.run(coroutine_function())

    def call_soon(self, coroutine_function):
        future = Future()
        try:
            future.success(self.run(coroutine_function))
        except Exception as exc:
            future.failure(exc)
        return future


def _client(manager):
    client = ClusterClient.__new__(ClusterClient)  # its __init__ connects to a cluster
    client._manager, client._lanes, client._coordinators, client.reads = manager, ConnectionLanes(manager), {}, READS
    return client


def _fenced(manager, node_id):
    """A metadata answer while ``node_id`` is down and fenced: the client forgets it."""
    manager.cluster.update_metadata(_metadata([n for n in (1, 2, 3) if n != node_id]))
    assert manager.cluster.broker_metadata(node_id) is None


def test_a_request_to_a_broker_the_metadata_dropped_reaches_it_once_it_is_back():
    manager = Manager(answers=[[1, 2, 3]])  # the cluster has broker 3 back
    _fenced(manager, 3)
    client = _client(manager)
    assert client.send(object(), 3).answered_by == 3
    assert manager.sent == [("MetadataRequest", 1), ("object", 3)]
    assert client.broker_ids() == [1, 2, 3]
    client.send(object(), 3)  # known now: no further refresh
    assert manager.sent[2:] == [("object", 3)]


def test_a_broker_still_missing_after_the_refresh_is_left_to_the_callers_retries_each_of_which_looks_again():
    manager = Manager(answers=[[1, 2], [1, 2, 3]])  # the first answer predates its return
    _fenced(manager, 3)
    client = _client(manager)
    with pytest.raises(kafka_errors.UnknownBrokerIdError):
        client.send(object(), 3)
    assert client.send(object(), 3).answered_by == 3
    assert [name for name, _ in manager.sent] == ["MetadataRequest", "MetadataRequest", "object"]


def test_a_request_to_a_known_broker_or_to_none_in_particular_does_not_refresh():
    manager = Manager(answers=[[1, 2, 3]])
    client = _client(manager)
    client.send(object(), 2)
    client.send(object())
    assert [name for name, _ in manager.sent] == ["object", "object"]


def test_a_concurrent_round_to_a_broker_that_came_back_reaches_it():
    """The coordinators' batched EndTxn and DescribeTransactions (execute_all) go through send_concurrently."""
    manager = Manager(answers=[[1, 2, 3]])
    _fenced(manager, 3)
    answers = _client(manager).send_concurrently([(object(), 1), (object(), 3)]).result(timeout=5)
    assert [answer.answered_by for answer in answers] == [1, 3]
    assert manager.sent == [("MetadataRequest", 1), ("object", 1), ("object", 3)]
