"""The I/O edge: carry out the sans-IO cores' commands on a real cluster, with kafka-python's protocol classes.

:class:`CoordinatorTransport` and :class:`ProduceTransport` are what the cores and the data plane need; the
model-based tests implement them against a model of Kafka's coordinator instead. :class:`KafkaTransport` implements
both over a :class:`~kafka2pc.cluster_client.ClusterClient`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any, Protocol

import attrs
import kafka.errors as kafka_errors
from kafka.protocol.admin.transactions import DescribeTransactionsRequest
from kafka.protocol.producer.produce import ProduceRequest
from kafka.protocol.producer.transaction import AddPartitionsToTxnRequest, EndTxnRequest, InitProducerIdRequest

from kafka2pc import broker_errors as codes
from kafka2pc.cluster_client import ClusterClient
from kafka2pc.coordinator_messages import (
    AddAnswer,
    AddPartitions,
    Answer,
    Command,
    ConfigValue,
    Described,
    DescribeTransaction,
    EndAnswer,
    EndTxn,
    InitAnswer,
    InitProducerId,
    NoAnswer,
    ObservedTransaction,
    ProducerIdentity,
    ReadBrokerConfig,
)
from kafka2pc.errors import (
    AuthorizationError,
    BrokerUnavailableError,
    KafkaProtocolError,
)
from kafka2pc.listing import TransactionListing, list_transactions
from kafka2pc.protocol_versions import INIT_PRODUCER_ID_2PC_VERSION

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


@attrs.frozen
class FramedBatch:
    """A record batch ready for the wire."""

    topic: str
    partition: int
    data: bytes


@attrs.frozen
class ProduceCall:
    """One Produce request to one broker."""

    transactional_id: str
    node: int
    batches: tuple[FramedBatch, ...]
    #: 12 for transaction protocol v2 (implicit partition registration), 11 for v1
    max_version: int
    timeout_ms: int


#: per partition: (error code, error message)
ProduceReply = dict[TopicPartition, tuple[int, str]]


@attrs.frozen
class ClusterFacts:
    """What a producer needs to know of the cluster before it initialises."""

    init_producer_id_max_version: int
    #: 2 when the cluster finalized transaction.version >= 2 and the broker speaks Produce v12 and EndTxn v5
    transaction_version: int


class CoordinatorTransport(Protocol):
    """Carries out coordinator commands for a transactional id."""

    def cluster_facts(self) -> ClusterFacts:
        """The protocol versions and features that decide how transactions run."""

    def execute(self, transactional_id: str, command: Command) -> Answer:
        """Send ``command`` and return its answer (:class:`NoAnswer` when none came in time)."""


class ProduceTransport(Protocol):
    """What a producer's data plane needs from the cluster."""

    def partition_leaders(self, topic: str) -> dict[int, int]:
        """Partition -> leader node id; raises if the topic is unknown."""

    def max_message_bytes(self, topic: str) -> int | None:
        """The topic's effective max.message.bytes, None when it cannot be read."""

    def send_produce(self, calls: Sequence[ProduceCall]) -> Future[list[ProduceReply | Exception]]:
        """Send the calls concurrently; the future gives each reply, or the exception it failed with, in order."""


class Transport(CoordinatorTransport, ProduceTransport, Protocol):
    """Everything a producer needs."""


@attrs.frozen
class TransactionDescription:
    """DescribeTransactions' view of one transactional id."""

    transactional_id: str
    state: str
    producer_id: int
    epoch: int
    timeout_ms: int
    start_time_ms: int
    partitions: tuple[tuple[str, int], ...]


class KafkaTransport:
    """:class:`CoordinatorTransport` and :class:`ProduceTransport` over a real cluster."""

    def __init__(self, client: ClusterClient, *, timeout_s: float):
        self.client = client
        self.timeout_s = timeout_s

    # -- coordinator -------------------------------------------------------------------------------------------------

    def cluster_facts(self) -> ClusterFacts:
        """Read from the bootstrap broker's ApiVersions and the cluster's finalized features."""
        client = self.client
        tv2 = (client.finalized_feature_level("transaction.version") >= 2
               and client.broker_max_version(ProduceRequest) >= 12
               and client.broker_max_version(EndTxnRequest) >= 5)
        return ClusterFacts(client.broker_max_version(InitProducerIdRequest), 2 if tv2 else 1)

    def execute(self, transactional_id: str, command: Command) -> Answer:
        """Send ``command`` to the coordinator of ``transactional_id``, following it as it moves."""
        try:
            if isinstance(command, InitProducerId):
                return self._init(transactional_id, command)
            if isinstance(command, EndTxn):
                return self._end(transactional_id, command)
            if isinstance(command, AddPartitions):
                return self._add(transactional_id, command)
            if isinstance(command, DescribeTransaction):
                if command.after_s:
                    time.sleep(command.after_s)
                return Described(self.describe(transactional_id))
            if isinstance(command, ReadBrokerConfig):
                return ConfigValue(self.broker_config(command.name))
        except BrokerUnavailableError as exc:
            return NoAnswer(str(exc))
        except AuthorizationError:
            if isinstance(command, DescribeTransaction | ReadBrokerConfig):
                raise
            # FindCoordinator refused: the answer the request itself would have had
            unauthorized = codes.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            return InitAnswer(unauthorized) if isinstance(command, InitProducerId) else \
                EndAnswer(unauthorized) if isinstance(command, EndTxn) else AddAnswer(unauthorized)
        raise TypeError(f"unknown command {command!r}")

    def execute_all(self, commands: Sequence[tuple[str, Command]]) -> list[Answer]:
        """Carry out commands of several transactional ids at once: EndTxn and DescribeTransactions go out
        concurrently, in one round trip; an answer that asks for a retry (a moved or loading coordinator, a busy one,
        a lost connection) and any other command go through :meth:`execute` one by one."""
        delay = max((c.after_s for _, c in commands if isinstance(c, DescribeTransaction)), default=0.0)
        if delay:
            time.sleep(delay)
        batched = [(i, txn_id, command) for i, (txn_id, command) in enumerate(commands)
                   if isinstance(command, EndTxn | DescribeTransaction)]
        answers: list[Answer | None] = [None] * len(commands)
        requests = []
        self.client.look_up_transaction_coordinators([txn_id for _, txn_id, _ in batched])
        for _, txn_id, command in batched:
            request = _end_request(txn_id, command) if isinstance(command, EndTxn) else \
                DescribeTransactionsRequest(transactional_ids=[txn_id])
            requests.append((request, self.client.transaction_coordinator(txn_id)))
        if requests:
            try:
                replies = self.client.send_concurrently(requests, keys=[txn_id for _, txn_id, _ in batched]).result(
                    timeout=self.timeout_s)
            except Exception as exc:  # the IO thread failed the round, or it timed out: each is retried on its own
                log.debug("concurrent coordinator round failed: %r", exc)
                self.client.abandon_spread_requests()  # none of it still goes out after its retry below
                replies = [exc] * len(requests)
            for (index, txn_id, command), reply in zip(batched, replies, strict=True):
                answers[index] = self._answer_of(txn_id, command, reply)
        return [answer if answer is not None else self.execute(txn_id, command)
                for answer, (txn_id, command) in zip(answers, commands, strict=True)]

    def _answer_of(self, transactional_id: str, command: EndTxn | DescribeTransaction, reply: Any) -> Answer | None:
        """The answer in ``reply``, or None when it must be asked again on its own."""
        if isinstance(reply, Exception):
            return None
        if isinstance(command, EndTxn):
            if reply.error_code in codes.COORDINATOR_RETRIABLE:
                return None
            return _end_answer(command, reply)
        entry = reply.transaction_states[0]
        if entry.error_code in codes.COORDINATOR_RETRIABLE or entry.error_code not in (
                codes.NONE, codes.TRANSACTIONAL_ID_NOT_FOUND):
            return None  # errors are raised, and retriable ones retried, by the one-by-one path
        if entry.error_code == codes.TRANSACTIONAL_ID_NOT_FOUND:
            return Described(None)
        return Described(ObservedTransaction(entry.transaction_state, entry.producer_id, entry.producer_epoch))

    def _init(self, transactional_id: str, command: InitProducerId) -> InitAnswer:
        response = init_producer_id(
            self.client, transactional_id, transaction_timeout_ms=command.transaction_timeout_ms,
            expected=command.expected, enable_2pc=command.enable_2pc, keep_prepared=command.keep_prepared,
            timeout_s=self.timeout_s, resend=not command.once)
        if response.error_code != codes.NONE:
            return InitAnswer(response.error_code)
        ongoing = None
        ongoing_id = getattr(response, "ongoing_txn_producer_id", -1)
        if isinstance(ongoing_id, int) and ongoing_id >= 0:
            ongoing = ProducerIdentity(ongoing_id, response.ongoing_txn_producer_epoch)
        return InitAnswer(codes.NONE, ProducerIdentity(response.producer_id, response.producer_epoch), ongoing)

    def _end(self, transactional_id: str, command: EndTxn) -> EndAnswer:
        response = self.client.send_to_transaction_coordinator(
            transactional_id, lambda: _end_request(transactional_id, command), timeout_s=self.timeout_s)
        return _end_answer(command, response)

    def _add(self, transactional_id: str, command: AddPartitions) -> AddAnswer:
        topics: dict[str, list[int]] = {}
        for topic, partition in sorted(command.partitions):
            topics.setdefault(topic, []).append(partition)
        identity = command.identity

        def request() -> Any:
            return AddPartitionsToTxnRequest(
                v3_and_below_transactional_id=transactional_id, v3_and_below_producer_id=identity.producer_id,
                v3_and_below_producer_epoch=identity.epoch, max_version=3,
                v3_and_below_topics=[AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name=t, partitions=p)
                                     for t, p in topics.items()])

        response = self.client.send_to_transaction_coordinator(transactional_id, request, error_code_of=_worst_add,
                                                                timeout_s=self.timeout_s)
        return AddAnswer(_worst_add(response))

    def describe(self, transactional_id: str) -> ObservedTransaction | None:
        """DescribeTransactions' state, producer id and epoch of ``transactional_id``; None if unknown."""
        found = self.describe_full(transactional_id)
        return None if found is None else ObservedTransaction(found.state, found.producer_id, found.epoch)

    def describe_full(self, transactional_id: str) -> TransactionDescription | None:
        """Everything DescribeTransactions says of ``transactional_id``; None if the coordinator does not know it."""
        response = self.client.send_to_transaction_coordinator(
            transactional_id, lambda: DescribeTransactionsRequest(transactional_ids=[transactional_id]),
            error_code_of=lambda r: int(r.transaction_states[0].error_code), timeout_s=self.timeout_s)
        entry = response.transaction_states[0]
        if entry.error_code == codes.TRANSACTIONAL_ID_NOT_FOUND:
            return None
        if entry.error_code == codes.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
            raise AuthorizationError(f"the principal may not describe transactional id {transactional_id!r}: "
                                     "grant DESCRIBE on it (TRANSACTIONAL_ID_AUTHORIZATION_FAILED)")
        if entry.error_code != codes.NONE:
            raise KafkaProtocolError("DescribeTransactions", codes.error_name(entry.error_code), entry.error_code)
        partitions = tuple(sorted((t.topic, p) for t in entry.topics for p in t.partitions))
        return TransactionDescription(transactional_id, entry.transaction_state, entry.producer_id,
                                      entry.producer_epoch, entry.transaction_timeout_ms,
                                      entry.transaction_start_time_ms, partitions)

    def list_transactions(self, *, states: Sequence[str] = (), pattern: str | None = None,
                          running_longer_than_ms: int | None = None) -> list[TransactionListing]:
        """ListTransactions on every broker: complete, or :class:`~kafka2pc.listing.IncompleteListingError`."""
        return list_transactions(self.client, states=states, pattern=pattern,
                                 running_longer_than_ms=running_longer_than_ms, timeout_s=self.timeout_s)

    def broker_config(self, name: str) -> str | None:
        """A broker config's value; None where it cannot be read (unknown, or no DESCRIBE_CONFIGS)."""
        try:
            return self.client.broker_configs([name])[name]
        except (kafka_errors.KafkaError, BrokerUnavailableError) as exc:
            log.debug("could not read broker config %s: %r", name, exc)
            return None

    # -- data plane --------------------------------------------------------------------------------------------------

    def partition_leaders(self, topic: str) -> dict[int, int]:
        """Partition -> leader node id of ``topic``."""
        return self.client.partition_leaders(topic)

    def max_message_bytes(self, topic: str) -> int | None:
        """The topic's effective max.message.bytes (None when DescribeConfigs is not allowed or fails)."""
        try:
            value = self.client.topic_configs(topic, ["max.message.bytes"])["max.message.bytes"]
        except (kafka_errors.KafkaError, BrokerUnavailableError) as exc:
            log.debug("could not read max.message.bytes of %s: %r", topic, exc)
            return None
        return int(value) if value is not None and value.isdigit() else None

    def send_produce(self, calls: Sequence[ProduceCall]) -> Future[list[ProduceReply | Exception]]:
        """Send the Produce requests concurrently on the IO thread."""
        raw = self.client.send_concurrently([(_produce_request(call), call.node) for call in calls])
        result: Future[list[ProduceReply | Exception]] = Future()

        def convert(done: Future[list[Any]]) -> None:
            try:
                answers = done.result()
            except Exception as exc:  # the IO thread failed the whole round: every call failed with it
                result.set_result([exc for _ in calls])
                return
            result.set_result([answer if isinstance(answer, Exception) else _produce_reply(answer)
                               for answer in answers])

        raw.add_done_callback(convert)
        return result


def init_producer_id(client: ClusterClient, transactional_id: str, *, transaction_timeout_ms: int,
                     expected: ProducerIdentity | None = None, enable_2pc: bool = False, keep_prepared: bool = False,
                     two_phase_fields: bool = False, timeout_s: float = 60.0, resend: bool = True) -> Any:
    """InitProducerId for ``transactional_id`` at its coordinator; returns the response.

    With ``two_phase_fields`` (implied by ``enable_2pc`` or ``keep_prepared``) the request is pinned to v6:
    kafka-python encodes at the negotiated version and silently drops fields it lacks, so an unpinned Enable2Pc
    request to a v5 broker would succeed as an ordinary InitProducerId.
    """
    producer_id, epoch = (expected.producer_id, expected.epoch) if expected is not None else (-1, -1)
    pinned = two_phase_fields or enable_2pc or keep_prepared

    def request() -> Any:
        if pinned:
            return InitProducerIdRequest(
                transactional_id=transactional_id, transaction_timeout_ms=transaction_timeout_ms,
                producer_id=producer_id, producer_epoch=epoch, enable2_pc=enable_2pc,
                keep_prepared_txn=keep_prepared, min_version=INIT_PRODUCER_ID_2PC_VERSION)
        return InitProducerIdRequest(transactional_id=transactional_id, transaction_timeout_ms=transaction_timeout_ms,
                                     producer_id=producer_id, producer_epoch=epoch)

    return client.send_to_transaction_coordinator(transactional_id, request, timeout_s=timeout_s, resend=resend)


def _end_request(transactional_id: str, command: EndTxn) -> Any:
    target = command.transaction
    return EndTxnRequest(transactional_id=transactional_id, producer_id=target.producer_id,
                         producer_epoch=target.epoch, committed=command.commit,
                         max_version=5 if command.transaction_version >= 2 else 4)


def _end_answer(command: EndTxn, response: Any) -> EndAnswer:
    following = None
    if response.error_code == codes.NONE and command.transaction_version >= 2 and \
            getattr(response, "producer_epoch", -1) >= 0:
        following = ProducerIdentity(response.producer_id, response.producer_epoch)
    return EndAnswer(response.error_code, following)


_RETRIABLE_ADD = frozenset({codes.CONCURRENT_TRANSACTIONS, codes.COORDINATOR_LOAD_IN_PROGRESS, codes.NOT_COORDINATOR,
                            codes.COORDINATOR_NOT_AVAILABLE})


def _worst_add(response: Any) -> int:
    top = int(getattr(response, "error_code", 0) or 0)
    if top:
        return top
    found = [p.partition_error_code for t in response.results_by_topic_v3_and_below
             for p in t.results_by_partition if p.partition_error_code != codes.NONE]
    retriable = [code for code in found if code in _RETRIABLE_ADD]
    chosen: int = retriable[0] if retriable else (found[0] if found else codes.NONE)
    return chosen


def _produce_request(call: ProduceCall) -> Any:
    topics: dict[str, list[Any]] = {}
    for batch in call.batches:
        topics.setdefault(batch.topic, []).append(
            ProduceRequest.TopicProduceData.PartitionProduceData(index=batch.partition, records=batch.data))
    return ProduceRequest(
        transactional_id=call.transactional_id, acks=-1, timeout_ms=call.timeout_ms,
        topic_data=[ProduceRequest.TopicProduceData(name=name, partition_data=parts)
                    for name, parts in topics.items()],
        max_version=call.max_version)


def _produce_reply(response: Any) -> ProduceReply:
    return {(t.name, p.index): (int(p.error_code), getattr(p, "error_message", None) or "")
            for t in response.responses for p in t.partition_responses}
