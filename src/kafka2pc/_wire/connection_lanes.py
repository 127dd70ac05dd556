"""Extra connections to a broker, so that independent requests sent together are worked on together.

A Kafka broker handles the requests of one connection one at a time, in order: its network processor mutes a
connection from the moment it reads a request until the response is sent. Eight EndTxn pipelined on one connection
therefore cost eight coordinator appends one after another (and kafka-python allows only five in flight on it).
Requests for distinct transactional ids are independent, so :class:`ConnectionLanes` spreads them over up to
``width`` connections per broker, all driven by kafka-python's one IO loop. Never for Produce: the batches of one
partition must reach the broker in order.

Each transactional id keeps its lane (sticky), so two requests for one id are never in flight on two connections at
once while its lane is up: they reach the coordinator in the order they were sent, as on a single connection. A lane
that fails is not used again for a while (its requests go to the manager's own connection, lane 0), and it never
touches the manager's backoff or authentication state, so lane 0 keeps working whatever happens to the others.

This module touches kafka-python's connection internals (pinned in pyproject), like
:mod:`kafka2pc._wire.cluster_client`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from kafka.errors import KafkaConnectionError
from kafka.net.connection import KafkaConnection

log = logging.getLogger(__name__)

#: connections per broker for a round of coordinator requests (the broker's request handlers default to 8)
DEFAULT_WIDTH = 8
#: a lane that failed to connect (or lost its connection with an error) is left alone this long
FAILED_LANE_PAUSE_S = 30.0
#: a lane idle this long is closed and opened again before use (brokers close idle connections after 10 minutes)
IDLE_LIMIT_S = 5 * 60.0
#: sticky lanes remembered per broker at most (forgotten all at once beyond: only the spread suffers)
_REMEMBERED_IDS = 10_000


class ConnectionLanes:
    """Lane 0 of a broker is the connection manager's own connection; lanes 1.. are opened on first use and kept."""

    def __init__(self, manager: Any, width: int = DEFAULT_WIDTH):
        if width < 1:
            raise ValueError(f"width must be at least 1, not {width}")
        self._manager = manager
        self.width = width
        self._lanes: dict[tuple[int, int], Any] = {}
        self._last_used: dict[tuple[int, int], float] = {}
        self._paused_until: dict[tuple[int, int], float] = {}
        self._lane_of: dict[int, dict[str, int]] = {}

    def assign(self, requests: Sequence[tuple[str, int]]) -> list[int]:
        """The lane of each ``(key, node)`` request, in order: a key keeps the lane it got first on that node; new
        keys take the lanes in turn."""
        for node in {node for _, node in requests}:
            if len(self._lane_of.get(node, ())) + len(requests) > _REMEMBERED_IDS:
                self._lane_of[node] = {}  # before the call's keys: one key gets one lane within a call
        lanes = []
        for key, node in requests:
            known = self._lane_of.setdefault(node, {})
            if key not in known:
                known[key] = len(known) % self.width
            lanes.append(known[key])
        return lanes

    def send(self, request: Any, node_id: int, lane: int) -> Any:
        """Send ``request`` on lane ``lane`` of ``node_id``; returns kafka-python's future, or the exception that
        kept it from being sent (never raises: the round's other requests are out already). Runs on the IO loop."""
        try:
            conn = self._connection(node_id, lane) if lane else None
            if conn is None:  # lane 0, a paused lane, a broker the metadata does not know: the manager's connection
                return self._manager.send(request, node_id=node_id)
            self._last_used[(node_id, lane)] = time.monotonic()
            return conn.send_request(request)
        except Exception as exc:  # e.g. an unknown broker id or a remembered authentication failure
            return exc

    def _connection(self, node_id: int, lane: int) -> Any:
        key = (node_id, lane)
        now = time.monotonic()
        if self._paused_until.get(key, 0.0) > now:
            return None
        conn = self._lanes.get(key)
        if conn is not None and not conn.closed:
            if now - self._last_used.get(key, now) < IDLE_LIMIT_S:
                return conn
            conn.close()  # idle long enough for the broker to drop it at any moment: a fresh one
        node = self._manager.cluster.broker_metadata(node_id)
        if node is None:
            return None
        conn = KafkaConnection(self._manager._net, node_id=node_id,
                               broker_version_data=self._manager.broker_version_data, **self._manager.config)
        self._lanes[key] = conn
        conn.close_future.add_both(lambda outcome: self._closed(key, conn, outcome))
        timeout_at = now + self._manager.socket_connection_setup_timeout_ms(node_id) / 1000
        # requests sent before the connection is set up are buffered by it and go out once it is
        self._manager._net.call_soon(lambda: self._connect(node, conn, timeout_at))
        # a TLS handshake does not time out by itself: a lane still setting up by then is closed (its requests fail)
        self._manager._net.call_at(timeout_at, lambda: self._give_up_setup(conn))
        log.debug("opening lane %d to broker %d", lane, node_id)
        return conn

    async def _connect(self, node: Any, conn: Any, timeout_at: float) -> None:
        """Like the manager's own connect, without its backoff and authentication bookkeeping."""
        transport = None
        try:
            transport = await self._manager._build_transport(node, timeout_at=timeout_at)
            if conn.closed or self._manager.closed:
                transport.close()
                return
            conn.connection_made(transport)
            transport = None
            await conn.initialize(timeout_at=timeout_at)
        except Exception as exc:  # its buffered requests fail with it; the round retries them on lane 0
            log.info("lane to broker %s could not be opened: %r", node.node_id, exc)
            conn.connection_lost(exc)
            if transport is not None:
                transport.close()

    @staticmethod
    def _give_up_setup(conn: Any) -> None:
        if conn.initializing:
            conn.close(KafkaConnectionError("lane setup timed out"))

    def _closed(self, key: tuple[int, int], conn: Any, outcome: Any) -> None:
        if self._lanes.get(key) is conn:
            self._lanes.pop(key, None)
        if isinstance(outcome, BaseException):
            self._paused_until[key] = time.monotonic() + FAILED_LANE_PAUSE_S

    def close(self, error: Exception | None = None) -> None:
        """Close every extra connection, failing what they still hold (with ``error``: and pause them). Runs on the
        IO loop."""
        for conn in list(self._lanes.values()):
            conn.close(error)
        self._lanes.clear()
