"""How independent coordinator requests are spread over a broker's connections."""

import pytest

from kafka2pc.connection_lanes import ConnectionLanes


def test_requests_to_one_broker_take_lanes_in_turn_per_broker():
    lanes = ConnectionLanes(manager=None, width=2)
    assert lanes.assign([1, 1, 2, 1, 2, 2]) == [0, 1, 0, 0, 1, 0]


def test_one_request_per_broker_uses_the_managers_own_connection():
    assert ConnectionLanes(manager=None).assign([3, 1, 2]) == [0, 0, 0]


def test_width_below_one_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        ConnectionLanes(manager=None, width=0)
