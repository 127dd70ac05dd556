"""ListTransactions across a whole cluster, complete or failing loudly: what LISTING recovery and
``kafka2pc txns`` stand on."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import kafka.errors as kafka_errors
from kafka.protocol.admin.transactions import ListTransactionsRequest

from kafka2pc._core import codes
from kafka2pc._core.messages import TransactionListing
from kafka2pc._core.retry import LISTING_ROUNDS, Retry
from kafka2pc._core.versions import LIST_TRANSACTIONS_DURATION_VERSION, LIST_TRANSACTIONS_PATTERN_VERSION
from kafka2pc._wire.cluster_client import ClusterClient
from kafka2pc._wire.retrying import TryAgain, with_retry
from kafka2pc.errors import IncompleteListingError, KafkaProtocolError, UnsupportedByBrokerError

log = logging.getLogger(__name__)

_TRANSACTION_STATE_TOPIC = "__transaction_state"


def list_transactions(client: ClusterClient, *, states: Sequence[str] = (), pattern: str | None = None,
                      running_longer_than_ms: int | None = None, timeout_s: float = 60.0) -> list[TransactionListing]:
    """ListTransactions on every broker, complete or :class:`IncompleteListingError`.

    A broker still loading a coordinator partition answers COORDINATOR_LOAD_IN_PROGRESS: it is asked again until
    ``timeout_s``. A ``__transaction_state`` partition without an available leader, or leaders that cannot be read,
    make the listing incomplete too; and since a broker answers only for the coordinators it leads when it is asked,
    the leaders (and their epochs) are read again after the fan-out and the listing repeated (under
    :data:`~kafka2pc._core.retry.LISTING_ROUNDS`) if any moved, or if a broker being asked left the cluster (killed
    and fenced: its coordinators moved, so the next round asks their new leaders instead of waiting for it).
    ``pattern`` (a regular expression on the whole transactional id) is sent to brokers with ListTransactions v2;
    callers must still filter client-side, as older brokers ignore it.
    """
    max_version = client.broker_max_version(ListTransactionsRequest)
    use_pattern = pattern is not None and max_version >= LIST_TRANSACTIONS_PATTERN_VERSION
    if running_longer_than_ms is not None and max_version < LIST_TRANSACTIONS_DURATION_VERSION:
        raise UnsupportedByBrokerError("filtering transactions by duration needs ListTransactions v1 "
                                       "(Apache Kafka 3.8+)")
    kwargs: dict[str, Any] = {"state_filters": list(states), "producer_id_filters": []}
    version = 0
    if running_longer_than_ms is not None:
        kwargs["duration_filter"] = running_longer_than_ms
        version = LIST_TRANSACTIONS_DURATION_VERSION
    if use_pattern:
        kwargs["transactional_id_pattern"] = pattern
        version = LIST_TRANSACTIONS_PATTERN_VERSION
    make_request = functools.partial(ListTransactionsRequest, min_version=version, **kwargs)
    rounds: Retry | None = LISTING_ROUNDS.started()
    while rounds is not None:  # bounded: coordinators rarely move twice during one listing
        leadership = _transaction_state_leadership(client)  # also refreshes the broker list
        brokers = client.broker_ids()
        orphans = sorted(p for p, (leader, _) in leadership.items() if leader not in brokers)
        if orphans:
            raise IncompleteListingError(f"{_TRANSACTION_STATE_TOPIC} partitions {orphans} have no available "
                                         "leader: their transactions cannot be listed")
        found: dict[str, TransactionListing] = {}
        try:
            for broker in brokers:
                for entry in _list_on(client, broker, make_request, timeout_s):
                    found[entry.transactional_id] = TransactionListing(entry.transactional_id, entry.producer_id,
                                                                       entry.transaction_state)
        except _BrokerLeft as left:
            why = f"broker {left.broker} left the cluster during ListTransactions (its coordinators moved)"
        else:
            # leader epochs, not only leaders: a partition that moved to a broker already asked and back to one not
            # asked yet (a broker restarted, then a preferred-leader election) has the same leader, a later epoch
            if _transaction_state_leadership(client) == leadership:
                return sorted(found.values(), key=lambda listing: listing.transactional_id)
            why = "transaction coordinators moved during ListTransactions"
        rounds = rounds.next()
        if rounds is not None:
            log.info("%s; listing again", why)
            time.sleep(rounds.delay_s)
    raise IncompleteListingError("transaction coordinators kept moving during ListTransactions")


class _BrokerLeft(Exception):
    """The broker being listed is no longer in the cluster's metadata (stopped and fenced): the listing starts again
    from the coordinators' new leaders instead of waiting for it to come back."""

    def __init__(self, broker: int) -> None:
        super().__init__(broker)
        self.broker = broker


def _list_on(client: ClusterClient, broker: int, make_request: Callable[[], Any], timeout_s: float) -> list[Any]:
    def ask() -> list[Any]:
        try:
            response = client.send(make_request(), broker)
        except kafka_errors.UnknownBrokerIdError:  # not in the metadata, even after the refresh send makes first
            raise _BrokerLeft(broker) from None
        code = int(response.error_code)
        kind = codes.kind(code)
        if kind is codes.Kind.COORDINATOR_BUSY:
            raise TryAgain(f"kept answering {codes.error_name(code)}")
        if kind is not codes.Kind.DONE:
            raise KafkaProtocolError("ListTransactions", codes.error_name(code), code, f"broker {broker}")
        return list(response.transaction_states)

    return with_retry(ask, attrs.evolve(client.reads, timeout_s=timeout_s), f"ListTransactions on broker {broker}",
                      exhausted=lambda problem: IncompleteListingError(
                          f"ListTransactions: broker {broker} {problem} for {timeout_s:g} s"))


def _transaction_state_leadership(client: ClusterClient) -> dict[int, tuple[int, int]]:
    """Partition -> (leader, leader epoch) of the transaction coordinators' topic ({} when it does not exist yet: no
    transaction ever ran on the cluster)."""
    try:
        return client.partition_leadership(_TRANSACTION_STATE_TOPIC)
    except KafkaProtocolError as exc:
        if codes.kind(exc.error_code) is codes.Kind.UNKNOWN_TOPIC:
            return {}
        raise IncompleteListingError(f"the leaders of {_TRANSACTION_STATE_TOPIC} cannot be read ({exc}), so a "
                                     "listing could miss transactions: grant DESCRIBE on that topic") from exc
