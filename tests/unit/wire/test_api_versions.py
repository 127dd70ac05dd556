"""Reading the brokers' ApiVersions again: the versions every broker speaks, put in the place of the ones kafka-python
keeps for every connection (its own, the spread lanes, and those it opens later)."""

import asyncio
import types

from kafka.protocol.metadata import ApiVersionsRequest
from kafka.protocol.producer.transaction import InitProducerIdRequest

from kafka2pc._wire import api_versions

INIT = InitProducerIdRequest.API_KEY
OLD = {INIT: (0, 5), 18: (0, 4), 1: (4, 17)}
NEW = {INIT: (0, 6), 18: (0, 4), 1: (4, 18)}


def test_the_common_ranges_are_what_every_broker_speaks():
    assert api_versions.common_ranges([NEW, OLD]) == OLD  # a rolling upgrade half done: v6 not yet
    assert api_versions.common_ranges([NEW, NEW]) == NEW
    assert api_versions.common_ranges([{1: (0, 3)}, {1: (4, 9), 2: (0, 1)}]) == {}  # nothing shared
    assert api_versions.common_ranges([]) == {}


class FakeClient:
    """A ClusterClient's parts that api_versions touches: brokers answering ApiVersions, and kafka-python's
    manager, connections and lanes holding the versions learnt first."""

    def __init__(self, answers):
        from kafka.protocol.broker_version_data import BrokerVersionData  # noqa: PLC0415

        learnt = BrokerVersionData(api_versions=dict(OLD))
        self._answers = answers
        self._manager = types.SimpleNamespace(broker_version_data=learnt, run=lambda call: asyncio.run(call()),
                                              _conns={1: types.SimpleNamespace(broker_version_data=learnt)})
        self._lanes = types.SimpleNamespace(_lanes={(1, 1): types.SimpleNamespace(broker_version_data=learnt)})

    def broker_ids(self):
        return sorted(self._answers)

    def send_idempotent(self, factory, node_id, *, what, timeout_s):
        assert isinstance(factory(), ApiVersionsRequest)
        ranges = self._answers[node_id]
        return types.SimpleNamespace(error_code=0, api_keys=[
            types.SimpleNamespace(api_key=key, min_version=low, max_version=high) for key, (low, high) in
            ranges.items()])


def test_versions_read_again_replace_the_ones_every_connection_kept():
    client = FakeClient({1: NEW, 2: NEW})
    assert api_versions.age_s(client) is None
    assert api_versions.read_again(client, timeout_s=1.0)
    held = [client._manager.broker_version_data, client._manager._conns[1].broker_version_data,
            client._lanes._lanes[(1, 1)].broker_version_data]
    assert [data.api_versions[INIT] for data in held] == [(0, 6)] * 3
    assert 0.0 <= api_versions.age_s(client) < 5.0


def test_a_half_upgraded_cluster_is_used_at_the_versions_all_of_it_speaks():
    client = FakeClient({1: NEW, 2: OLD})
    assert api_versions.read_again(client, timeout_s=1.0)
    assert client._manager._conns[1].broker_version_data.api_versions[INIT] == (0, 5)
