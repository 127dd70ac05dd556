"""The I/O edge on a real cluster: carry out the machines' commands and the data plane's Produce calls with
kafka-python's protocol classes, and report what came back. It never decides: an answer with a coordinator error,
or :class:`~kafka2pc._core.messages.NoAnswer`, goes back to the machine, which decides whether to send again
(:mod:`kafka2pc._core.resend`). The only bookkeeping is the coordinator cache: after a coordinator error or a lost
connection the next request looks the coordinator up afresh."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import attrs
import kafka.errors as kafka_errors
from kafka.protocol.admin.transactions import DescribeTransactionsRequest
from kafka.protocol.producer.produce import ProduceRequest
from kafka.protocol.producer.transaction import AddPartitionsToTxnRequest, EndTxnRequest, InitProducerIdRequest

from kafka2pc._core import codes
from kafka2pc._core.initialization import versions_too_old
from kafka2pc._core.messages import (
    AddAnswer,
    AddPartitions,
    Answer,
    ClusterFacts,
    Command,
    ConfigValue,
    Described,
    DescribeTransaction,
    EndAnswer,
    EndTxn,
    FactsAnswer,
    InitAnswer,
    InitProducerId,
    NoAnswer,
    ObservedTransaction,
    ProducerIdentity,
    ReadBrokerConfig,
    ReadClusterFacts,
    TransactionDescription,
    TransactionListing,
)
from kafka2pc._core.versions import INIT_PRODUCER_ID_2PC_VERSION
from kafka2pc._data.produce import ProduceCall, ProduceReply
from kafka2pc._wire import api_versions
from kafka2pc._wire.cluster_client import ClusterClient
from kafka2pc._wire.connection_lanes import DEFAULT_WIDTH
from kafka2pc._wire.listing import list_transactions
from kafka2pc._wire.retrying import NOT_SENT, TRANSIENT
from kafka2pc.errors import AuthorizationError, BrokerUnavailableError, KafkaProtocolError, UnsupportedByBrokerError

log = logging.getLogger(__name__)
#: requests of one concurrent round at most: a broker's lanes times the five requests kafka-python keeps in flight on
#: a connection. Beyond that a connection refuses to send ("Node paused: max_in_flight"), and the refused requests,
#: sent again together, starved (256 aborts at once: some went unanswered for 60 s); a larger round goes in waves
WAVE = DEFAULT_WIDTH * 5
#: how long reading the brokers' ApiVersions again may take: where one does not answer, the known ones are used
_READ_AGAIN_S = 5.0


class KafkaTransport:
    """The machines' transport (:class:`~kafka2pc._core.driver.CoordinatorTransport`) and the data plane's
    (:class:`~kafka2pc._data.produce.ProduceTransport`) over a real cluster. ``timeout_s`` bounds a round of
    concurrent requests and a listing."""

    def __init__(self, client: ClusterClient, *, timeout_s: float):
        self.client = client
        self.timeout_s = timeout_s

    def now(self) -> float:
        """The monotonic clock."""
        return time.monotonic()

    def cluster_facts(self) -> ClusterFacts:
        """Read from the ApiVersions the client holds (the bootstrap broker's when it connected, or every broker's
        since :class:`~kafka2pc._core.messages.ReadClusterFacts`; their age says which) and the cluster's finalized
        features, read afresh. Where ``transaction.version`` 2 is finalized but the held versions lack it (learnt
        before an in-place upgrade), every broker's versions are read again first, at most once per
        ``VERSIONS_MAX_AGE_S``: the cluster finalizes a level only once all its brokers speak it."""
        client = self.client
        level = client.finalized_feature_level("transaction.version")
        if level >= 2 and not _speaks_protocol_2(client) and not self._versions_fresh():
            self._read_versions_again()
        tv2 = level >= 2 and _speaks_protocol_2(client)
        return ClusterFacts(client.broker_max_version(InitProducerIdRequest), 2 if tv2 else 1,
                            versions_age_s=api_versions.age_s(client),
                            finalized_transaction_version=min(2, max(1, level)))

    def _versions_for(self, commands: Sequence[Command]) -> None:
        """Before a transaction protocol 2 end on a client whose versions lack EndTxn v5 (learnt before an upgrade),
        read every broker's versions again."""
        if any(isinstance(c, EndTxn) and c.transaction_version >= 2 for c in commands) \
                and self.client.broker_max_version(EndTxnRequest) < 5 \
                and not self._versions_fresh():  # not at every resend of a refused end
            self._read_versions_again()

    # -- coordinator commands ----------------------------------------------------------------------------------------

    def execute(self, transactional_id: str, command: Command) -> Answer:
        """Wait ``command.after_s``, send ``command`` to the coordinator of ``transactional_id``, and return what
        came back."""
        if command.after_s:
            time.sleep(command.after_s)
        if isinstance(command, ReadBrokerConfig):
            return ConfigValue(self._broker_config(command.name))
        if isinstance(command, ReadClusterFacts):
            self._read_versions_again()
            return FactsAnswer(self.cluster_facts())
        self._versions_for([command])
        node = self._coordinator(transactional_id, command)
        if not isinstance(node, int):
            return node
        try:
            response = self.client.send(_request(transactional_id, command), node_id=node)
        except TRANSIENT as exc:
            return self._lost(transactional_id, exc)
        except UnsupportedByBrokerError as exc:
            if isinstance(command, EndTxn) and not self._versions_fresh():
                return self._refused_for_now(transactional_id, exc)
            if isinstance(command, InitProducerId) and (command.enable_2pc or command.keep_prepared):
                # the connection found the broker without InitProducerId v6 (2PC turned off, a downgrade) while the
                # client's versions still had it: reported as the broker's own refusal would be
                return InitAnswer(codes.UNSUPPORTED_VERSION)
            raise
        return self._answer(transactional_id, command, response)

    def execute_all(self, commands: Sequence[tuple[str, Command]]) -> list[Answer | Exception]:
        """Carry out commands of several transactional ids at once: EndTxn and DescribeTransactions go out
        concurrently, in one round trip (spread over several connections per broker); any other command goes
        through :meth:`execute`. A command the client refused to send (a version the brokers lack) gets the error
        :meth:`execute` would raise, in place of its answer."""
        delay = max((command.after_s for _, command in commands), default=0.0)
        if delay:
            time.sleep(delay)
        self._versions_for([command for _, command in commands])
        answers: list[Answer | Exception | None] = [None] * len(commands)
        batched = [(i, txn_id, command) for i, (txn_id, command) in enumerate(commands)
                   if isinstance(command, EndTxn | DescribeTransaction)]
        self.client.look_up_transaction_coordinators([txn_id for _, txn_id, _ in batched])
        sent = []
        for index, txn_id, command in batched:
            node = self._coordinator(txn_id, command)
            if isinstance(node, int):
                sent.append((index, txn_id, command, node))
            else:
                answers[index] = node
        for start in range(0, len(sent), WAVE):  # bounded by len(sent)
            wave = sent[start:start + WAVE]
            for (index, txn_id, command, _), reply in zip(wave, self._send_wave(wave), strict=True):
                if isinstance(reply, kafka_errors.IncompatibleBrokerVersion):  # refused by the client: never sent
                    refused = UnsupportedByBrokerError(str(reply))  # as execute raises it: the machine's say
                    answers[index] = refused if self._versions_fresh() else self._refused_for_now(txn_id, refused)
                else:
                    answers[index] = self._lost(txn_id, reply) if isinstance(reply, Exception) else \
                        self._answer(txn_id, command, reply)
        return [answer if answer is not None else self.execute(txn_id, attrs.evolve(command, after_s=0.0))
                for answer, (txn_id, command) in zip(answers, commands, strict=True)]

    def _send_wave(self, wave: Sequence[tuple[int, str, Command, int]]) -> list[Any]:
        """Send ``(index, transactional id, command, node)`` all at once; each one's response or error."""
        requests = [(_request(txn_id, command), node) for _, txn_id, command, node in wave]
        try:
            return list(self.client.send_concurrently(requests, keys=[txn_id for _, txn_id, _, _ in wave]).result(
                timeout=self.timeout_s))
        except Exception as exc:  # the IO thread failed the round, or it timed out
            log.debug("concurrent coordinator round failed: %r", exc)
            self.client.abandon_spread_requests()  # none of it may still go out after it is sent again
            return [exc] * len(wave)

    def _coordinator(self, transactional_id: str, command: Command) -> int | Answer:
        """The coordinator's node id, or the answer the command gets when it cannot be found."""
        try:
            return self.client.transaction_coordinator(transactional_id)
        except AuthorizationError:
            if isinstance(command, DescribeTransaction):
                raise
            # FindCoordinator refused: the answer the request itself would have had
            unauthorized = codes.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            return InitAnswer(unauthorized) if isinstance(command, InitProducerId) else \
                EndAnswer(unauthorized) if isinstance(command, EndTxn) else AddAnswer(unauthorized)
        except KafkaProtocolError as exc:
            if codes.kind(exc.error_code) is not codes.Kind.COORDINATOR_BUSY:
                raise
            return NoAnswer(f"the coordinator of {transactional_id!r} cannot be found yet ({exc.error_name})",
                            sent=False, cause=exc)
        except (BrokerUnavailableError, *TRANSIENT) as exc:
            return NoAnswer(f"the coordinator of {transactional_id!r} cannot be found ({exc!r})", sent=False,
                            cause=exc)

    def _read_versions_again(self) -> None:
        """Every broker's ApiVersions, read again and put to use (the known ones stay where one does not answer)."""
        api_versions.read_again(self.client, timeout_s=min(self.timeout_s, _READ_AGAIN_S))

    def _versions_fresh(self) -> bool:
        """Whether the versions the client holds were read from every broker lately: only then does a request the
        client refuses to send say the cluster lacks that version, and not that a read of them failed or is due."""
        return not versions_too_old(api_versions.age_s(self.client))

    def _refused_for_now(self, transactional_id: str, exc: Exception) -> NoAnswer:
        """An EndTxn the client refused on versions that may be stale (a broker did not answer their re-read during a
        restart): not sent, so the machine may send it again; never a FatalError for a decided transaction."""
        return NoAnswer(f"coordinator of {transactional_id!r}: the client cannot send this EndTxn on the versions it "
                        f"holds, which could not be read again yet ({exc}); not sent", sent=False, cause=exc)

    def _lost(self, transactional_id: str, exc: Exception) -> NoAnswer:
        self.client.forget_coordinator(transactional_id)
        if isinstance(exc, NOT_SENT):
            return NoAnswer(f"coordinator of {transactional_id!r}: {type(exc).__name__} ({exc}); not sent", sent=False,
                            cause=exc)
        return NoAnswer(f"coordinator of {transactional_id!r}: {type(exc).__name__}; the request may or may not have "
                        "been processed", cause=exc)

    def _answer(self, transactional_id: str, command: Command, response: Any) -> Answer:
        """The answer a coordinator's response gives ``command``."""
        answer: InitAnswer | EndAnswer | AddAnswer | Described
        if isinstance(command, InitProducerId):
            answer = _init_answer(response)
        elif isinstance(command, EndTxn):
            answer = _end_answer(command, response)
        elif isinstance(command, AddPartitions):
            answer = AddAnswer(_worst_add(response))
        elif isinstance(command, DescribeTransaction):
            answer = _described(transactional_id, response)
        else:
            raise TypeError(f"unknown command {command!r}")
        if codes.kind(answer.error) is codes.Kind.COORDINATOR_BUSY:
            self.client.forget_coordinator(transactional_id)
        return answer

    def _broker_config(self, name: str) -> str | None:
        try:
            return self.client.broker_configs([name])[name]
        except (kafka_errors.KafkaError, BrokerUnavailableError) as exc:
            log.debug("could not read broker config %s: %r", name, exc)
            return None

    def list_transactions(self, *, states: Sequence[str] = (), pattern: str | None = None,
                          running_longer_than_ms: int | None = None) -> list[TransactionListing]:
        """ListTransactions on every broker: complete, or :class:`~kafka2pc.errors.IncompleteListingError`."""
        return list_transactions(self.client, states=states, pattern=pattern,
                                 running_longer_than_ms=running_longer_than_ms, timeout_s=self.timeout_s)

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


def _speaks_protocol_2(client: ClusterClient) -> bool:
    """Whether the versions the client holds carry transaction protocol 2 (KIP-890: Produce v12, EndTxn v5)."""
    return client.broker_max_version(ProduceRequest) >= 12 and client.broker_max_version(EndTxnRequest) >= 5


def _request(transactional_id: str, command: Command) -> Any:
    """The kafka-python request of a coordinator command."""
    if isinstance(command, InitProducerId):
        expected = command.expected
        producer_id, epoch = (expected.producer_id, expected.epoch) if expected is not None else (-1, -1)
        if command.enable_2pc or command.keep_prepared:
            # pinned: kafka-python encodes at the negotiated version and silently drops fields it lacks, so an
            # unpinned Enable2Pc request to a v5 broker would succeed as an ordinary InitProducerId
            return InitProducerIdRequest(
                transactional_id=transactional_id, transaction_timeout_ms=command.transaction_timeout_ms,
                producer_id=producer_id, producer_epoch=epoch, enable2_pc=command.enable_2pc,
                keep_prepared_txn=command.keep_prepared, min_version=INIT_PRODUCER_ID_2PC_VERSION)
        return InitProducerIdRequest(transactional_id=transactional_id,
                                     transaction_timeout_ms=command.transaction_timeout_ms, producer_id=producer_id,
                                     producer_epoch=epoch)
    if isinstance(command, EndTxn):
        target = command.transaction
        if command.transaction_version >= 2:  # pinned: a connection holding older versions must not send v4
            return EndTxnRequest(transactional_id=transactional_id, producer_id=target.producer_id,
                                 producer_epoch=target.epoch, committed=command.commit, max_version=5, min_version=5)
        return EndTxnRequest(transactional_id=transactional_id, producer_id=target.producer_id,
                             producer_epoch=target.epoch, committed=command.commit, max_version=4)
    if isinstance(command, AddPartitions):
        topics: dict[str, list[int]] = {}
        for topic, partition in sorted(command.partitions):
            topics.setdefault(topic, []).append(partition)
        identity = command.identity
        return AddPartitionsToTxnRequest(
            v3_and_below_transactional_id=transactional_id, v3_and_below_producer_id=identity.producer_id,
            v3_and_below_producer_epoch=identity.epoch, max_version=3,
            v3_and_below_topics=[AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name=t, partitions=p)
                                 for t, p in topics.items()])
    if isinstance(command, DescribeTransaction):
        return DescribeTransactionsRequest(transactional_ids=[transactional_id])
    raise TypeError(f"unknown command {command!r}")


def _init_answer(response: Any) -> InitAnswer:
    if codes.kind(response.error_code) is not codes.Kind.DONE:
        return InitAnswer(response.error_code)
    ongoing = None
    ongoing_id = getattr(response, "ongoing_txn_producer_id", -1)
    if isinstance(ongoing_id, int) and ongoing_id >= 0:
        ongoing = ProducerIdentity(ongoing_id, response.ongoing_txn_producer_epoch)
    return InitAnswer(codes.NONE, ProducerIdentity(response.producer_id, response.producer_epoch), ongoing)


def _end_answer(command: EndTxn, response: Any) -> EndAnswer:
    following = None
    if codes.kind(response.error_code) is codes.Kind.DONE and command.transaction_version >= 2 and \
            getattr(response, "producer_epoch", -1) >= 0:
        following = ProducerIdentity(response.producer_id, response.producer_epoch)
    return EndAnswer(response.error_code, following)


def _described(transactional_id: str, response: Any) -> Described:
    entry = response.transaction_states[0]
    code = int(entry.error_code)
    kind = codes.kind(code)
    if kind is codes.Kind.UNKNOWN_ID:
        return Described(None)
    if kind is codes.Kind.COORDINATOR_BUSY:
        return Described(None, error=code)
    if kind is codes.Kind.UNAUTHORIZED:
        raise AuthorizationError(f"the principal may not describe transactional id {transactional_id!r}: "
                                 "grant DESCRIBE on it, or WRITE, which implies it "
                                 "(TRANSACTIONAL_ID_AUTHORIZATION_FAILED)")
    if kind is not codes.Kind.DONE:
        raise KafkaProtocolError("DescribeTransactions", codes.error_name(code), code)
    partitions = tuple(sorted((t.topic, p) for t in entry.topics for p in t.partitions))
    description = TransactionDescription(transactional_id, entry.transaction_state, entry.producer_id,
                                         entry.producer_epoch, entry.transaction_timeout_ms,
                                         entry.transaction_start_time_ms, partitions)
    return Described(ObservedTransaction(entry.transaction_state, entry.producer_id, entry.producer_epoch),
                     description=description)


def _worst_add(response: Any) -> int:
    top = int(getattr(response, "error_code", codes.NONE) or codes.NONE)
    if codes.kind(top) is not codes.Kind.DONE:
        return top
    found = [p.partition_error_code for t in response.results_by_topic_v3_and_below
             for p in t.results_by_partition if codes.kind(p.partition_error_code) is not codes.Kind.DONE]
    retriable = [code for code in found if codes.kind(code) is codes.Kind.COORDINATOR_BUSY]
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
