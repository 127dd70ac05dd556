"""How independent coordinator requests are spread over a broker's connections."""

import pytest
from kafka.errors import KafkaConnectionError

from kafka2pc._wire.connection_lanes import ConnectionLanes


class Manager:
    """Just what ConnectionLanes asks of kafka-python's connection manager when it does not open a lane."""

    def __init__(self):
        self.sent = []
        self.cluster = self

    def send(self, request, node_id):
        self.sent.append((request, node_id))
        return "lane 0"

    def broker_metadata(self, node_id):
        return None  # unknown: no lane is opened


def test_keys_take_the_lanes_of_a_broker_in_turn():
    lanes = ConnectionLanes(manager=None, width=2)
    assert lanes.assign([("a", 1), ("b", 1), ("c", 2), ("d", 1), ("e", 2)]) == [0, 1, 0, 0, 1]


def test_a_key_keeps_its_lane_so_its_requests_stay_in_order():
    lanes = ConnectionLanes(manager=None, width=8)
    first = lanes.assign([(f"id-{i}", 1) for i in range(8)])
    assert first == list(range(8))
    assert lanes.assign([(f"id-{i}", 1) for i in reversed(range(8))]) == list(reversed(first))
    assert lanes.assign([("id-3", 1), ("id-3", 1)]) == [3, 3]


def test_a_lane_that_failed_is_left_alone_and_its_requests_use_the_managers_connection():
    manager = Manager()
    lanes = ConnectionLanes(manager)
    lanes._closed((1, 2), conn=None, outcome=KafkaConnectionError("refused"))
    assert lanes.send("request", 1, 2) == "lane 0"
    assert manager.sent == [("request", 1)]


def test_a_broker_the_metadata_does_not_know_is_asked_on_the_managers_connection():
    manager = Manager()
    assert ConnectionLanes(manager).send("request", 7, 3) == "lane 0"
    assert manager.sent == [("request", 7)]


def test_width_below_one_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        ConnectionLanes(manager=None, width=0)


class Refusing(Manager):
    def send(self, request, node_id):
        raise KafkaConnectionError("remembered authentication failure")


def test_a_request_that_cannot_be_sent_comes_back_as_its_error_and_never_raises():
    outcome = ConnectionLanes(Refusing()).send("request", 1, 0)
    assert isinstance(outcome, KafkaConnectionError)


def test_the_lane_table_is_forgotten_before_a_call_so_a_key_repeated_in_it_keeps_one_lane(monkeypatch):
    monkeypatch.setattr("kafka2pc._wire.connection_lanes._REMEMBERED_IDS", 4)
    lanes = ConnectionLanes(manager=None, width=8)
    lanes.assign([("a", 1), ("b", 1), ("c", 1)])
    assigned = lanes.assign([("x", 1), ("y", 1), ("x", 1)])
    assert assigned[0] == assigned[2]


class Setup:
    initializing = True
    closed_with = None

    def close(self, error=None):
        self.closed_with = error


def test_a_lane_still_setting_up_at_its_deadline_is_closed_with_an_error():
    conn = Setup()
    ConnectionLanes._give_up_setup(conn)
    assert isinstance(conn.closed_with, KafkaConnectionError)
    ready = Setup()
    ready.initializing = False
    ConnectionLanes._give_up_setup(ready)
    assert ready.closed_with is None
