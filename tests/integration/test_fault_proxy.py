"""FaultProxy between real clients and a real broker: addresses rewritten so nothing bypasses it, and each fault
(DROP, CUT, DELAY, blackhole) doing exactly what it says, with the broker's side checked directly."""

import socket
import struct
import time
import uuid

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.admin import CreateTopicsRequest, CreateTopicsResponse
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    FindCoordinatorRequest,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import EndTxnRequest, InitProducerIdRequest, ProduceRequest

from kafka2pc.cluster import ClusterClient
from kafka2pc.config import ClientConfig
from kafka2pc.testing.verify import read_records, values
from kafka2pc.transaction_control import TransactionControl
from kafka2pc_harness.proxy import CUT, DELAY, DROP, FaultProxy
from kafka2pc_harness.proxy_wire import RequestInfo, WireError, rewrite_response
from tests.integration.txn_helpers import produce_all, transactional_producer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

CREATE_TOPICS_VERSION = 5
METADATA_VERSION = 12
API_VERSIONS_VERSION = 3


@pytest.fixture
def proxy(kafka):
    with FaultProxy(kafka.bootstrap_servers) as fault_proxy:
        yield fault_proxy
        assert fault_proxy.errors == []


class RawKafka:
    """One plain socket speaking Kafka, requests encoded by kafka-python: to see exactly what arrives, and when."""

    def __init__(self, address: str):
        host, port = address.split(",", maxsplit=1)[0].rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self._correlation_id = 0

    def close(self):
        self.sock.close()

    def send(self, request, version: int) -> int:
        self._correlation_id += 1
        request.with_header(correlation_id=self._correlation_id, client_id="fault-proxy-test")
        self.sock.sendall(bytes(request.encode(version=version, header=True, framed=True)))
        return self._correlation_id

    def receive(self, timeout: float):
        """(correlation id, payload) of the next response; None if the proxy closed the connection."""
        self.sock.settimeout(timeout)
        prefix = self._exactly(4)
        if prefix is None:
            return None
        payload = self._exactly(struct.unpack(">i", prefix)[0])
        assert payload is not None, "connection closed inside a frame"
        return struct.unpack_from(">i", payload)[0], payload

    def _exactly(self, size: int):
        data = b""
        while len(data) < size:
            try:
                chunk = self.sock.recv(size - len(data))
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return None
            data += chunk
        return data


def create_topics_request(name: str):
    return CreateTopicsRequest(topics=[CreateTopicsRequest.CreatableTopic(
        name=name, num_partitions=1, replication_factor=-1, assignments=[], configs=[])], timeout_ms=10_000)


def topic_exists(bootstrap: str, name: str) -> bool:
    """Asked of the broker directly, not through the proxy."""
    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(name, timeout=10).topics.get(name)
    return meta is not None and meta.error is None


def wait_until(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_confluent_producer_and_read_committed_consumer_go_through_the_proxy(kafka, proxy, topic_factory):
    topic = topic_factory(kafka)
    producer = transactional_producer(proxy.bootstrap_servers)
    producer.begin_transaction()
    payloads = [f"via-proxy-{i}".encode() for i in range(50)]
    produce_all(producer, topic, payloads)
    producer.commit_transaction(30)

    assert values(read_records(proxy.bootstrap_servers, topic)) == payloads  # read_committed, through the proxy
    advertised = AdminClient({"bootstrap.servers": proxy.bootstrap_servers}).list_topics(timeout=10).brokers
    nodes = {node.node_id: node for node in proxy.nodes()}
    assert set(nodes) == set(kafka.node_ids)
    assert {b.id: f"{b.host}:{b.port}" for b in advertised.values()} == {n: nodes[n].address for n in nodes}
    assert all(node.address != node.upstream for node in nodes.values())
    assert proxy.requests_seen(ProduceRequest) >= 1
    assert proxy.requests_seen(EndTxnRequest) == 1
    assert proxy.requests_seen(FetchRequest) >= 1


def test_cluster_client_works_through_the_proxy(kafka, proxy, topic_factory):
    topic = topic_factory(kafka, partitions=2)
    txn_id = f"proxy-client-{uuid.uuid4().hex[:8]}"
    with ClusterClient(ClientConfig.for_bootstrap(proxy.bootstrap_servers)) as client:
        assert client.broker_ids() == sorted(kafka.node_ids)
        assert set(client.partition_leaders(topic).values()) <= set(kafka.node_ids)
        # sent again while a fresh broker's transaction coordinator is still loading
        identity = TransactionControl(client, timeout_s=30).fence(txn_id)
        assert client.transaction_coordinator(txn_id) in kafka.node_ids
    assert identity.producer_id >= 0
    assert proxy.requests_seen(FindCoordinatorRequest) >= 1
    # one, or more where the test runs first on a fresh broker (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS)
    assert proxy.responses_seen(InitProducerIdRequest) == proxy.requests_seen(InitProducerIdRequest) >= 1


def test_dropped_response_the_broker_acted_but_the_client_timed_out(kafka, proxy):
    rule = proxy.on_response(CreateTopicsRequest, action=DROP)
    name = f"t-dropped-answer-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap_servers})
    started = time.monotonic()
    future = admin.create_topics([NewTopic(name, num_partitions=1)], request_timeout=3.0)[name]
    with pytest.raises(KafkaException) as raised:
        future.result(timeout=20)
    assert raised.value.args[0].code() == KafkaError._TIMED_OUT
    assert time.monotonic() - started >= 2.5
    assert rule.fired.is_set()
    assert rule.fire_count == 1
    assert topic_exists(kafka.bootstrap_servers, name)  # the broker created it

    # the rule fired once: the next CreateTopics is answered
    other = f"t-answered-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(other, num_partitions=1)], request_timeout=10.0)[other].result(timeout=20)
    assert rule.fire_count == 1


def test_dropped_init_producer_id_response_is_retried_and_the_epoch_shows_the_first_was_applied(kafka, proxy):
    txn_id = f"proxy-dropped-init-{uuid.uuid4().hex[:8]}"
    rule = proxy.on_response(InitProducerIdRequest, action=DROP)
    config = ClientConfig.from_dict({"bootstrap.servers": proxy.bootstrap_servers, "request.timeout.ms": 2000})
    with ClusterClient(config) as client:
        identity = TransactionControl(client, timeout_s=30).fence(txn_id)  # sent again after the lost answer
    assert rule.fire_count == 1
    assert proxy.requests_seen(InitProducerIdRequest) == 2
    assert identity.epoch == 1  # a new transactional id starts at 0: the unanswered request took it


def test_dropped_request_never_reaches_the_broker(kafka, proxy):
    rule = proxy.on_request(CreateTopicsRequest, action=DROP)
    name = f"t-dropped-request-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap_servers})  # kept: a collected client fails its futures
    future = admin.create_topics([NewTopic(name, num_partitions=1)], request_timeout=3.0)[name]
    with pytest.raises(KafkaException) as raised:
        future.result(timeout=20)
    assert raised.value.args[0].code() == KafkaError._TIMED_OUT
    assert rule.fire_count == 1
    assert proxy.responses_seen(CreateTopicsRequest) == 0
    assert not topic_exists(kafka.bootstrap_servers, name)


def test_a_dropped_response_leaves_the_connection_open(proxy):
    proxy.on_response(MetadataRequest, action=DROP)
    raw = RawKafka(proxy.bootstrap_servers)
    try:
        raw.send(MetadataRequest(topics=[], allow_auto_topic_creation=False), METADATA_VERSION)
        with pytest.raises(TimeoutError):
            raw.receive(timeout=1.5)
        later = raw.send(ApiVersionsRequest(client_software_name="t", client_software_version="1"),
                         API_VERSIONS_VERSION)
        answer = raw.receive(timeout=10)
        assert answer is not None
        assert answer[0] == later
    finally:
        raw.close()


def test_cut_response_closes_the_connection_after_the_broker_acted(kafka, proxy):
    rule = proxy.on_response(CreateTopicsRequest, action=CUT)
    name = f"t-cut-answer-{uuid.uuid4().hex[:8]}"
    raw = RawKafka(proxy.bootstrap_servers)
    try:
        raw.send(create_topics_request(name), CREATE_TOPICS_VERSION)
        assert raw.receive(timeout=15) is None  # closed, no response
    finally:
        raw.close()
    assert rule.fire_count == 1
    assert wait_until(lambda: topic_exists(kafka.bootstrap_servers, name))
    assert wait_until(lambda: proxy.open_connections() == 0)


def test_cut_request_closes_the_connection_before_the_broker_sees_it(kafka, proxy):
    rule = proxy.on_request(CreateTopicsRequest, action=CUT)
    name = f"t-cut-request-{uuid.uuid4().hex[:8]}"
    raw = RawKafka(proxy.bootstrap_servers)
    try:
        raw.send(create_topics_request(name), CREATE_TOPICS_VERSION)
        assert raw.receive(timeout=15) is None
    finally:
        raw.close()
    assert rule.fire_count == 1
    assert proxy.responses_seen(CreateTopicsRequest) == 0
    assert not topic_exists(kafka.bootstrap_servers, name)

    # the next connection is proxied normally, and the (once-only) rule stays quiet
    raw = RawKafka(proxy.bootstrap_servers)
    try:
        sent = raw.send(create_topics_request(name), CREATE_TOPICS_VERSION)
        answer = raw.receive(timeout=15)
    finally:
        raw.close()
    assert answer is not None
    assert answer[0] == sent
    response = CreateTopicsResponse.decode(answer[1], version=CREATE_TOPICS_VERSION, header=True)
    assert [t.error_code for t in response.topics] == [0]


def test_delayed_response_arrives_late_and_in_order(proxy):
    rule = proxy.on_response(ApiVersionsRequest, action=DELAY(1.5))
    raw = RawKafka(proxy.bootstrap_servers)
    try:
        started = time.monotonic()
        first = raw.send(ApiVersionsRequest(client_software_name="t", client_software_version="1"),
                         API_VERSIONS_VERSION)
        second = raw.send(MetadataRequest(topics=[], allow_auto_topic_creation=False), METADATA_VERSION)
        answers = [raw.receive(timeout=10), raw.receive(timeout=10)]
        elapsed = time.monotonic() - started
    finally:
        raw.close()
    assert [answer[0] for answer in answers] == [first, second]  # the metadata answer waited behind it
    assert elapsed >= 1.4
    assert rule.fire_count == 1
    metadata = MetadataResponse.decode(answers[1][1], version=METADATA_VERSION, header=True)
    assert {f"{b.host}:{b.port}" for b in metadata.brokers} == {node.address for node in proxy.nodes()}


def test_delayed_request_reaches_the_broker_late(proxy):
    rule = proxy.on_request(MetadataRequest, action=DELAY(1.0))
    raw = RawKafka(proxy.bootstrap_servers)
    try:
        started = time.monotonic()
        sent = raw.send(MetadataRequest(topics=[], allow_auto_topic_creation=False), METADATA_VERSION)
        answer = raw.receive(timeout=10)
        elapsed = time.monotonic() - started
    finally:
        raw.close()
    assert answer is not None
    assert answer[0] == sent
    assert elapsed >= 0.9
    assert rule.fire_count == 1


def test_blackhole_makes_the_broker_unreachable_until_restored(kafka, proxy, topic_factory):
    topic = topic_factory(kafka)
    failures = []
    producer = Producer({"bootstrap.servers": proxy.bootstrap_servers, "message.timeout.ms": 3000,
                         "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 200})

    def delivered(err, _message):
        if err is not None:
            failures.append(err)

    def produce(value: bytes) -> None:
        producer.produce(topic, value=value, on_delivery=delivered)
        producer.flush(15)

    produce(b"before")
    assert failures == []
    assert proxy.open_connections() >= 1
    refused_before = proxy.refused_connections

    proxy.blackhole()
    assert proxy.open_connections() == 0
    assert all(node.blackholed for node in proxy.nodes())
    raw = RawKafka(proxy.bootstrap_servers)
    try:
        assert raw.receive(timeout=5) is None  # accepted, then closed at once
    finally:
        raw.close()
    produce(b"while-blackholed")
    assert [err.code() for err in failures] == [KafkaError._MSG_TIMED_OUT]
    assert proxy.refused_connections > refused_before

    proxy.restore()
    produce(b"after")
    assert len(failures) == 1
    # no other way to the broker: the message sent during the blackhole never arrived
    assert values(read_records(kafka.bootstrap_servers, topic)) == [b"before", b"after"]


def test_blackhole_of_one_node_and_unknown_nodes(kafka, proxy):
    with pytest.raises(KeyError):
        proxy.blackhole(node_id=12345)
    AdminClient({"bootstrap.servers": proxy.bootstrap_servers}).list_topics(timeout=10)  # learn the nodes
    node = proxy.nodes()[0]
    proxy.blackhole(node_id=node.node_id)
    raw = RawKafka(node.address)
    try:
        assert raw.receive(timeout=5) is None
    finally:
        raw.close()
    proxy.restore(node_id=node.node_id)
    raw = RawKafka(node.address)
    try:
        sent = raw.send(ApiVersionsRequest(client_software_name="t", client_software_version="1"),
                        API_VERSIONS_VERSION)
        answer = raw.receive(timeout=10)
    finally:
        raw.close()
    assert answer is not None
    assert answer[0] == sent


def test_close_stops_listening_and_closes_connections(kafka):
    fault_proxy = FaultProxy(kafka.bootstrap_servers).start()
    address = fault_proxy.bootstrap_servers
    raw = RawKafka(address)
    try:
        raw.send(ApiVersionsRequest(client_software_name="t", client_software_version="1"), API_VERSIONS_VERSION)
        assert raw.receive(timeout=10) is not None
        fault_proxy.close()
        assert raw.receive(timeout=5) is None
    finally:
        raw.close()
        fault_proxy.close()  # idempotent
    with pytest.raises(ConnectionRefusedError):
        RawKafka(address)


def test_a_broker_not_known_at_bootstrap_gets_its_own_port(kafka, topic_factory):
    host, port = kafka.bootstrap_servers.split(",")[0].rsplit(":", 1)
    if host != "127.0.0.1":
        pytest.skip("needs a broker that advertises 127.0.0.1")
    topic = topic_factory(kafka)
    # the broker advertises 127.0.0.1, so the "localhost" bootstrap listener cannot stand for it
    with FaultProxy(f"localhost:{port}") as fault_proxy:
        producer = Producer({"bootstrap.servers": fault_proxy.bootstrap_servers})
        producer.produce(topic, value=b"through-a-learned-port")
        assert producer.flush(15) == 0
        [node] = fault_proxy.nodes()
        assert node.upstream == kafka.bootstrap_servers
        assert node.address != fault_proxy.bootstrap_servers
        advertised = AdminClient({"bootstrap.servers": fault_proxy.bootstrap_servers}).list_topics(timeout=10)
        assert [f"{b.host}:{b.port}" for b in advertised.brokers.values()] == [node.address]

        fault_proxy.blackhole(node.node_id)  # the learned port only: the bootstrap port still answers
        for address, refused in ((node.address, True), (fault_proxy.bootstrap_servers, False)):
            raw = RawKafka(address)
            try:
                raw.send(ApiVersionsRequest(client_software_name="t", client_software_version="1"),
                         API_VERSIONS_VERSION)
                assert (raw.receive(timeout=10) is None) is refused
            finally:
                raw.close()
        assert fault_proxy.errors == []
    assert values(read_records(kafka.bootstrap_servers, topic)) == [b"through-a-learned-port"]


@pytest.mark.cluster
def test_each_broker_of_a_three_node_cluster_is_proxied(kafka_3node, topic_factory):
    topic = topic_factory(kafka_3node, partitions=3, replication_factor=3)
    with FaultProxy(kafka_3node.bootstrap_servers) as fault_proxy:
        producer = transactional_producer(fault_proxy.bootstrap_servers, acks="all")
        producer.begin_transaction()
        payloads = [f"p-{i}".encode() for i in range(300)]
        produce_all(producer, topic, payloads)
        producer.commit_transaction(30)
        assert sorted(values(read_records(fault_proxy.bootstrap_servers, topic))) == sorted(payloads)
        nodes = fault_proxy.nodes()
        assert [node.node_id for node in nodes] == sorted(kafka_3node.node_ids)
        assert len({node.address for node in nodes}) == len({node.upstream for node in nodes}) == 3

        fault_proxy.blackhole(nodes[0].node_id)
        for node in nodes:
            raw = RawKafka(node.address)
            try:
                raw.send(ApiVersionsRequest(client_software_name="t", client_software_version="1"),
                         API_VERSIONS_VERSION)
                assert (raw.receive(timeout=10) is None) is (node is nodes[0])
            finally:
                raw.close()
        assert fault_proxy.errors == []


def _api_versions_response(metadata_max: int) -> bytes:
    response = ApiVersionsResponse(error_code=0, api_keys=[
        ApiVersionsResponse.ApiVersion(api_key=MetadataRequest.API_KEY, min_version=0, max_version=metadata_max),
        ApiVersionsResponse.ApiVersion(api_key=ProduceRequest.API_KEY, min_version=3, max_version=99),
    ], throttle_time_ms=0, version=API_VERSIONS_VERSION)
    response.with_header(correlation_id=7)
    return bytes(response.encode(header=True))


def test_api_versions_are_capped_to_what_the_proxy_can_rewrite():
    request = RequestInfo(ApiVersionsRequest.API_KEY, API_VERSIONS_VERSION, 7)
    capped = ApiVersionsResponse.decode(rewrite_response(request, _api_versions_response(99), lambda *a: ("", 0)),
                                        version=API_VERSIONS_VERSION, header=True)
    assert {e.api_key: e.max_version for e in capped.api_keys} == {
        MetadataRequest.API_KEY: MetadataResponse.max_version, ProduceRequest.API_KEY: 99}
    unchanged = _api_versions_response(MetadataResponse.max_version)
    assert rewrite_response(request, unchanged, lambda *a: ("", 0)) is unchanged


def test_an_unreadable_address_response_is_an_error_not_a_silent_pass():
    with pytest.raises(WireError):
        rewrite_response(RequestInfo(MetadataRequest.API_KEY, METADATA_VERSION, 1), b"\x00\x00\x00\x01\xff",
                         lambda *a: ("", 0))
