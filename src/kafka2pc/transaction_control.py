"""Operations on a transactional id through its coordinator, without owning a producer: describe, end a transaction
under its own producer id and epoch, complete a prepared one exactly, abort a lingering one, list by prefix.

Shared by :class:`~kafka2pc.TwoPhaseProducer` (recovery), the sink committer and recovery, and the CLI.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Iterable
from typing import Any

import attrs
from kafka.protocol.admin.transactions import DescribeTransactionsRequest, ListTransactionsRequest
from kafka.protocol.producer.transaction import EndTxnRequest, InitProducerIdRequest

from kafka2pc import broker_errors as codes
from kafka2pc.cluster_client import ClusterClient, error_name
from kafka2pc.completion import IN_FLUX, Action, ObservedTransaction, decide
from kafka2pc.errors import (
    AuthorizationError,
    BrokerUnavailableError,
    KafkaProtocolError,
    TransactionLostError,
    UnsupportedByBrokerError,
)
from kafka2pc.prepared_state import PreparedTxnState
from kafka2pc.protocol_versions import (
    INIT_PRODUCER_ID_2PC_VERSION,
    LIST_TRANSACTIONS_DURATION_VERSION,
    LIST_TRANSACTIONS_PATTERN_VERSION,
)

log = logging.getLogger(__name__)

OPEN_STATES = ("Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence")


def init_producer_id(client: ClusterClient, transactional_id: str, *, transaction_timeout_ms: int,
                     producer_id: int = -1, epoch: int = -1, enable_2pc: bool = False, keep_prepared: bool = False,
                     two_phase_fields: bool = False, timeout_s: float = 60.0) -> Any:
    """InitProducerId for ``transactional_id`` at its coordinator; returns the response.

    With ``two_phase_fields`` (implied by ``enable_2pc`` or ``keep_prepared``) the request is pinned to v6:
    kafka-python encodes at the negotiated version and silently drops fields it lacks, so an unpinned Enable2Pc
    request to a v5 broker would succeed as an ordinary InitProducerId.
    """
    if two_phase_fields or enable_2pc or keep_prepared:
        def request() -> Any:
            return InitProducerIdRequest(
                transactional_id=transactional_id, transaction_timeout_ms=transaction_timeout_ms,
                producer_id=producer_id, producer_epoch=epoch, enable2_pc=enable_2pc,
                keep_prepared_txn=keep_prepared, min_version=INIT_PRODUCER_ID_2PC_VERSION)
    else:
        def request() -> Any:
            return InitProducerIdRequest(transactional_id=transactional_id,
                                         transaction_timeout_ms=transaction_timeout_ms, producer_id=producer_id,
                                         producer_epoch=epoch)
    return client.send_to_transaction_coordinator(transactional_id, request, timeout_s=timeout_s)


@attrs.frozen
class TransactionListing:
    """One transactional id as ListTransactions reports it."""

    transactional_id: str
    producer_id: int
    state: str


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


class TransactionControl:
    """Coordinator-side operations on transactional ids. ``transaction_version`` is the protocol the transactions
    were written with (2 when the cluster finalized ``transaction.version >= 2``)."""

    def __init__(self, client: ClusterClient, *, transaction_version: int | None = None, timeout_s: float = 60.0):
        self.client = client
        self.timeout_s = timeout_s
        if transaction_version is None:
            tv2 = (client.finalized_feature_level("transaction.version") >= 2
                   and client.broker_max_version(EndTxnRequest) >= 5)
            transaction_version = 2 if tv2 else 1
        self.transaction_version = transaction_version

    # -- reading ---------------------------------------------------------------------------------------------------

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
            raise KafkaProtocolError("DescribeTransactions", error_name(entry.error_code), entry.error_code)
        partitions = tuple(sorted((t.topic, p) for t in entry.topics for p in t.partitions))
        return TransactionDescription(transactional_id, entry.transaction_state, entry.producer_id,
                                      entry.producer_epoch, entry.transaction_timeout_ms,
                                      entry.transaction_start_time_ms, partitions)

    def describe(self, transactional_id: str) -> ObservedTransaction | None:
        """State, producer id and epoch of ``transactional_id``; None if unknown."""
        found = self.describe_full(transactional_id)
        return None if found is None else ObservedTransaction(found.state, found.producer_id, found.epoch)

    def describe_settled(self, transactional_id: str) -> ObservedTransaction | None:
        """:meth:`describe`, repeated while the coordinator is still ending or fencing a transaction."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            observed = self.describe(transactional_id)
            if observed is None or observed.state not in IN_FLUX:
                return observed
            if time.monotonic() > deadline:
                raise BrokerUnavailableError(f"transaction of {transactional_id!r} stayed in {observed.state} for "
                                             f"{self.timeout_s:g} s")
            time.sleep(0.05)

    def list(self, *, states: Iterable[str] = (), pattern: str | None = None,
             running_longer_than_ms: int | None = None) -> list[TransactionListing]:
        """ListTransactions on every broker. ``pattern`` (a regular expression on the transactional id) is sent to
        brokers with ListTransactions v2; callers must still filter client-side, as older brokers ignore it."""
        max_version = self.client.broker_max_version(ListTransactionsRequest)
        use_pattern = pattern is not None and max_version >= LIST_TRANSACTIONS_PATTERN_VERSION
        if running_longer_than_ms is not None and max_version < LIST_TRANSACTIONS_DURATION_VERSION:
            raise UnsupportedByBrokerError("filtering transactions by duration needs ListTransactions v1 "
                                           "(Apache Kafka 3.8+)")
        found: dict[str, TransactionListing] = {}
        for broker in self.client.broker_ids():
            kwargs: dict[str, Any] = {"state_filters": list(states), "producer_id_filters": []}
            version = 0
            if running_longer_than_ms is not None:
                kwargs["duration_filter"] = running_longer_than_ms
                version = LIST_TRANSACTIONS_DURATION_VERSION
            if use_pattern:
                kwargs["transactional_id_pattern"] = pattern
                version = LIST_TRANSACTIONS_PATTERN_VERSION
            response = self.client.send_idempotent(
                functools.partial(ListTransactionsRequest, min_version=version, **kwargs), node_id=broker,
                what="ListTransactions")
            if response.error_code != codes.NONE:
                raise KafkaProtocolError("ListTransactions", error_name(response.error_code), response.error_code)
            for entry in response.transaction_states:
                found[entry.transactional_id] = TransactionListing(entry.transactional_id, entry.producer_id,
                                                                   entry.transaction_state)
        return sorted(found.values(), key=lambda listing: listing.transactional_id)

    # -- ending ----------------------------------------------------------------------------------------------------

    def end(self, transactional_id: str, transaction: PreparedTxnState, *, commit: bool) -> Any:
        """EndTxn for ``transaction`` under its own producer id and epoch; returns the response."""
        tv2 = self.transaction_version >= 2
        return self.client.send_to_transaction_coordinator(
            transactional_id,
            lambda: EndTxnRequest(transactional_id=transactional_id, producer_id=transaction.producer_id,
                                  producer_epoch=transaction.epoch, committed=commit, max_version=5 if tv2 else 4),
            timeout_s=self.timeout_s)

    def decide(self, transactional_id: str, requested: PreparedTxnState) -> tuple[Action, ObservedTransaction | None]:
        """What completing ``requested`` needs, from the coordinator's settled view."""
        observed = self.describe_settled(transactional_id)
        return decide(requested, observed, transaction_version=self.transaction_version), observed

    def complete(self, transactional_id: str, requested: PreparedTxnState) -> bool:
        """Commit ``requested`` if it is the ongoing transaction, else abort whatever is ongoing. True when
        ``requested`` is (now or already) committed; TransactionLostError if the broker aborted it."""
        for _ in range(10):  # bounded: each pass either ends something or learns the outcome
            action, observed = self.decide(transactional_id, requested)
            if action is Action.ALREADY_COMMITTED:
                return True
            if action is Action.ALREADY_ABORTED:
                raise TransactionLostError(transactional_id, requested.producer_id, requested.epoch,
                                           f"the broker reports it aborted ({observed})")
            if action is Action.NOTHING_PENDING:
                return False
            assert observed is not None
            commit = action is Action.COMMIT_ONGOING
            response = self.end(transactional_id, observed.as_prepared_state, commit=commit)
            if response.error_code == codes.NONE:
                if commit:
                    return True
                continue  # the aborted one was not ``requested``; look again for what became of it
            log.info("EndTxn for %s of %r answered %s; looking again", observed.as_prepared_state, transactional_id,
                     error_name(response.error_code))
        raise BrokerUnavailableError(f"could not settle the transaction of {transactional_id!r}")

    def abort_ongoing(self, transactional_id: str) -> ObservedTransaction | None:
        """Abort whatever transaction is open on ``transactional_id``, by the id's own InitProducerId (as a
        restarting producer would); returns what was aborted, or None if nothing was open."""
        observed = self.describe_settled(transactional_id)
        if observed is None or observed.state != "Ongoing":
            return None
        response = init_producer_id(self.client, transactional_id, transaction_timeout_ms=60_000,
                                    timeout_s=self.timeout_s)
        if response.error_code == codes.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
            raise AuthorizationError(f"the principal may not abort transactions of {transactional_id!r}: grant "
                                     "WRITE on it")
        if response.error_code != codes.NONE:
            raise KafkaProtocolError("InitProducerId", error_name(response.error_code), response.error_code,
                                     f"aborting {transactional_id!r}")
        self.describe_settled(transactional_id)  # wait until the abort markers are written
        return observed
