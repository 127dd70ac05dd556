"""The wire edge of kafka2pc: send kafka-python protocol messages to the right broker and wait for the answer.

Everything that touches kafka-python's networking internals lives here, so the rest of kafka2pc sees only
protocol request/response objects and kafka2pc's own errors.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

import attrs
import kafka.errors as kafka_errors
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient
from kafka.protocol.metadata import FindCoordinatorRequest, MetadataRequest

from kafka2pc._core import codes
from kafka2pc._core.codes import error_name
from kafka2pc._core.retry import READS
from kafka2pc._wire.connection_lanes import ConnectionLanes
from kafka2pc._wire.kafka_settings import kafka_python_kwargs
from kafka2pc._wire.refusals import refusal, refusal_aware_client
from kafka2pc._wire.retrying import TRANSIENT, with_retry
from kafka2pc.config import ClientConfig
from kafka2pc.errors import (
    AuthorizationError,
    BrokerUnavailableError,
    Kafka2pcError,
    KafkaProtocolError,
    UnsupportedByBrokerError,
)

log = logging.getLogger(__name__)
_T = TypeVar("_T")

_TRANSACTION_COORDINATOR = 1  # FindCoordinator key_type


class ClusterClient:
    """A connection pool to one Kafka cluster, running kafka-python's IO loop on a background thread.

    Blocking methods: each sends a protocol message and returns the broker's response object.
    """

    def __init__(self, config: ClientConfig, *, bootstrap_timeout_s: float = 30.0, client_id: str | None = None):
        kwargs = kafka_python_kwargs(config)
        kwargs.setdefault("client_id", client_id or f"kafka2pc-{uuid.uuid4().hex[:8]}")
        kwargs["bootstrap_timeout_ms"] = int(bootstrap_timeout_s * 1000)
        kwargs["kafka_client"] = refusal_aware_client
        try:
            self._admin = KafkaAdminClient(**kwargs)
        except Kafka2pcError:
            raise
        except kafka_errors.KafkaTimeoutError as exc:
            raise BrokerUnavailableError(
                f"no broker answered at {config.bootstrap_servers} within {bootstrap_timeout_s:g} s"
            ) from exc
        except kafka_errors.KafkaError as exc:
            error = refusal(exc, config.options.get("sasl_mechanism"))
            if error is not None:
                raise error from None
            raise BrokerUnavailableError(f"could not connect to {config.bootstrap_servers}: {exc}") from exc
        self._manager = self._admin._manager
        self._lanes = ConnectionLanes(self._manager)
        self._coordinators: dict[str, int] = {}
        self.bootstrap_servers = config.bootstrap_servers
        #: how metadata-like requests are retried while no broker answers (for a producer's max.block.ms)
        self.reads = attrs.evolve(READS, timeout_s=bootstrap_timeout_s)

    # -- lifecycle ---------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Close every connection and stop the IO thread."""
        self._close_lanes(None)
        self._admin.close()

    def __enter__(self) -> ClusterClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- versions and features ---------------------------------------------------------------------------------

    def broker_api_range(self, request_class: Any) -> tuple[int, int] | None:
        """The (min, max) version the bootstrap broker advertises for an API, or None if it has none."""
        versions = self._manager.broker_version_data.api_versions or {}
        found = versions.get(request_class.API_KEY)
        return (int(found[0]), int(found[1])) if found is not None else None

    def broker_max_version(self, request_class: Any) -> int:
        """The highest version the broker advertises for an API; -1 when it lacks the API."""
        found = self.broker_api_range(request_class)
        return found[1] if found is not None else -1

    def _with_retries(self, call: Callable[[], _T], what: str, timeout_s: float | None = None) -> _T:
        """Run an idempotent read, retrying connection-level failures (a broker restarting, a leader moving), for
        ``timeout_s`` (default: the client's :attr:`reads` policy's)."""
        policy = self.reads if timeout_s is None else attrs.evolve(self.reads, timeout_s=timeout_s)
        return with_retry(call, policy, what)

    def finalized_feature_level(self, feature: str) -> int:
        """The finalized cluster-wide level of a feature (e.g. ``transaction.version``); 0 when not finalized."""
        features = self._with_retries(self._admin.describe_features, "DescribeFeatures")
        finalized = features.get(feature, {}).get("finalized")
        return int(finalized[1]) if finalized else 0

    def broker_configs(self, names: Iterable[str]) -> dict[str, str | None]:
        """Values of the named configs on one broker of the cluster (None where the broker does not know one)."""
        wanted = list(names)
        broker_id = str(self.broker_ids()[0])
        result = self._with_retries(lambda: self._admin.describe_configs(
            [ConfigResource(ConfigResourceType.BROKER, broker_id, wanted)], config_filter="all"), "DescribeConfigs")
        entries: dict[str, dict[str, Any]] = result.get("broker", {}).get(broker_id, {})
        return {name: (entries[name]["value"] if name in entries else None) for name in wanted}

    def topic_configs(self, topic: str, names: Iterable[str]) -> dict[str, str | None]:
        """Effective values of the named configs of ``topic`` (None where one cannot be read)."""
        wanted = list(names)
        result = self._with_retries(lambda: self._admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, wanted)], config_filter="all"), "DescribeConfigs")
        entries: dict[str, dict[str, Any]] = result.get("topic", {}).get(topic, {})
        return {name: (entries[name]["value"] if name in entries else None) for name in wanted}

    def broker_ids(self) -> list[int]:
        """Ids of the brokers in the cluster metadata, sorted."""
        return sorted(int(b.node_id) for b in self._manager.cluster.brokers())

    def partition_leaders(self, topic: str) -> dict[int, int]:
        """Partition -> leader node id for ``topic``, from a fresh Metadata request (raises if the topic is unknown)."""
        return {partition: leader for partition, (leader, _) in self.partition_leadership(topic).items()}

    def partition_leadership(self, topic: str) -> dict[int, tuple[int, int]]:
        """Partition -> (leader node id, leader epoch) for ``topic``, from a fresh Metadata request (raises if the
        topic is unknown). The epoch grows with every election, so a leadership that moved away and back is told
        from one that stayed (-1 where a broker does not say)."""
        response = self._with_retries(lambda: self.send(MetadataRequest(
            topics=[MetadataRequest.MetadataRequestTopic(name=topic)], allow_auto_topic_creation=False)), "Metadata")
        self._manager.cluster.update_metadata(response)  # so the connection manager knows every node id
        for entry in response.topics:
            if entry.name != topic:
                continue
            if codes.kind(entry.error_code) is not codes.Kind.DONE:
                raise KafkaProtocolError("Metadata", error_name(entry.error_code), entry.error_code, f"topic {topic!r}")
            return {p.partition_index: (p.leader_id, getattr(p, "leader_epoch", -1)) for p in entry.partitions}
        missing = codes.UNKNOWN_TOPIC_OR_PARTITION
        raise KafkaProtocolError("Metadata", error_name(missing), missing, f"topic {topic!r}")

    # -- requests ----------------------------------------------------------------------------------------------

    def send_idempotent(self, request_factory: Callable[[], Any], node_id: int | None = None, *,
                        what: str = "request", timeout_s: float = 30.0) -> Any:
        """:meth:`send` for requests that may be repeated (reads), retrying connection-level failures until
        ``timeout_s``."""
        return self._with_retries(lambda: self.send(request_factory(), node_id), what, timeout_s)

    def send(self, request: Any, node_id: int | None = None) -> Any:
        """Send one request (to ``node_id``, else the least loaded broker) and return its response. A ``node_id`` the
        client's metadata does not know is looked up in fresh metadata first (:meth:`_follow_returned_brokers`)."""

        async def call() -> Any:
            if node_id is not None:
                await self._follow_returned_brokers([node_id])
            return await self._manager.send(request, node_id=node_id)

        try:
            return self._manager.run(call)
        except kafka_errors.IncompatibleBrokerVersion as exc:
            raise UnsupportedByBrokerError(str(exc)) from exc

    def send_concurrently(self, requests: list[tuple[Any, int]], *,
                          keys: Sequence[str] | None = None) -> Future[list[Any]]:
        """Send ``(request, node_id)`` pairs at once; the future gives each response, or the exception it failed
        with, in order. It does not block: the IO thread does the work. With ``keys`` (one per request, e.g. its
        transactional id) requests for the same broker are spread over several connections
        (:mod:`~kafka2pc._wire.connection_lanes`) so that it works on them together, each key always on the same one:
        only for requests whose order matters per key at most."""
        result: Future[list[Any]] = Future()
        lanes = self._lanes.assign([(key, node) for key, (_, node) in zip(keys, requests, strict=True)]) \
            if keys is not None else [0] * len(requests)

        async def call() -> None:
            await self._follow_returned_brokers([node for _, node in requests])
            pending = [self._lanes.send(request, node, lane) for (request, node), lane in zip(requests, lanes,
                                                                                               strict=True)]
            answers: list[Any] = []
            for future in pending:
                if isinstance(future, Exception):  # it was never sent
                    answers.append(future)
                    continue
                try:
                    answers.append(await future)
                except Exception as exc:  # handed to the caller, which classifies it
                    answers.append(exc)
            result.set_result(answers)

        def failed(exc: BaseException) -> None:
            if not result.done():
                result.set_exception(exc)

        scheduled = self._manager.call_soon(call)
        scheduled.add_errback(failed)
        return result

    async def _follow_returned_brokers(self, node_ids: Iterable[int]) -> None:
        """On the IO thread, before requests to ``node_ids``: if the client's metadata lacks one of them, refresh it.

        A broker down long enough to be fenced is missing from every metadata answer meanwhile, and each answer
        replaces kafka-python's broker map, so the client forgets it. Nothing asks again when it comes back
        (kafka-python refreshes on a failed connection, and after ``metadata.max.age.ms``, 5 minutes by default): a
        request to it (its coordinators moved back, a listing waiting for it) fails with UnknownBrokerIdError
        meanwhile. A refresh that still lacks it (the broker is gone, or the answer predates its return) leaves that
        error to the caller's retries, each of which looks again."""
        cluster = self._manager.cluster
        unknown = sorted({node for node in node_ids if cluster.broker_metadata(node) is None})
        if not unknown:
            return
        try:
            await cluster.refresh_metadata()  # joins a refresh already under way
        except Exception as exc:  # the request to the unknown broker fails as before; its caller retries
            log.debug("could not refresh the metadata for brokers %s: %r", unknown, exc)
            return
        log.debug("brokers %s unknown to the client's metadata; after a refresh: %s", unknown,
                  [node for node in unknown if cluster.broker_metadata(node) is not None] or "still unknown")

    def abandon_spread_requests(self) -> None:
        """Close the extra connections (:meth:`send_concurrently` with ``keys``), failing every request they still
        hold, before a caller that gave up waiting for a round sends some of it again: a request left buffered on a
        lane still setting up would otherwise go out after its repetition."""
        self._close_lanes(kafka_errors.KafkaConnectionError("the round was abandoned"))

    def _close_lanes(self, error: Exception | None) -> None:
        """Close the extra connections on the IO thread (``error``: fail what they hold and pause them)."""

        async def close_lanes() -> None:
            self._lanes.close(error)

        try:
            self._manager.run(close_lanes)
        except Exception as exc:  # the client is closing: its connections go with it
            log.debug("could not close the extra connections: %r", exc)

    def look_up_transaction_coordinators(self, transactional_ids: Sequence[str]) -> None:
        """Learn the coordinators of many ids in one FindCoordinator (v4+, KIP-699) instead of one round trip each.
        Only a shortcut: ids it could not resolve are left to :meth:`transaction_coordinator`, which raises."""
        missing = [t for t in dict.fromkeys(transactional_ids) if t not in self._coordinators]
        if len(missing) < 2 or self.broker_max_version(FindCoordinatorRequest) < 4:
            return
        try:
            response = self.send(FindCoordinatorRequest(key_type=_TRANSACTION_COORDINATOR, coordinator_keys=missing,
                                                        min_version=4))
        except (Kafka2pcError, *TRANSIENT) as exc:
            log.debug("batched FindCoordinator failed (%r): looking up one id at a time", exc)
            return
        for answer in response.coordinators:
            if codes.kind(answer.error_code) is codes.Kind.DONE and answer.key in missing:
                self._coordinators[answer.key] = int(answer.node_id)

    def transaction_coordinator(self, transactional_id: str, *, refresh: bool = False) -> int:
        """The node id of the transaction coordinator for ``transactional_id``."""
        if not refresh and transactional_id in self._coordinators:
            return self._coordinators[transactional_id]
        if self.broker_max_version(FindCoordinatorRequest) >= 4:
            response = self.send(FindCoordinatorRequest(
                key_type=_TRANSACTION_COORDINATOR, coordinator_keys=[transactional_id], min_version=4))
            answer = response.coordinators[0]
        else:
            answer = self.send(FindCoordinatorRequest(
                key=transactional_id, key_type=_TRANSACTION_COORDINATOR, max_version=3))
        kind = codes.kind(answer.error_code)
        if kind is codes.Kind.UNAUTHORIZED:
            raise AuthorizationError(f"the principal may not use transactional id {transactional_id!r}: grant WRITE "
                                     "on it (DESCRIBE to only read it; TRANSACTIONAL_ID_AUTHORIZATION_FAILED)")
        if kind is not codes.Kind.DONE:
            raise KafkaProtocolError("FindCoordinator", error_name(answer.error_code), answer.error_code,
                                     f"transactional id {transactional_id!r}")
        self._coordinators[transactional_id] = int(answer.node_id)
        return int(answer.node_id)

    def forget_coordinator(self, transactional_id: str) -> None:
        """The coordinator of ``transactional_id`` moved, or may have: look it up afresh before the next request."""
        self._coordinators.pop(transactional_id, None)
