"""Extra connections to a broker, so that independent requests sent together are worked on together.

A Kafka broker handles the requests of one connection one at a time, in order: its network processor mutes a
connection from the moment it reads a request until the response is sent. Eight EndTxn pipelined on one connection
therefore cost eight coordinator appends one after another (and kafka-python allows only five in flight on it).
Requests for distinct transactional ids are independent, so :class:`ConnectionLanes` spreads them over up to
``width`` connections per broker, all driven by kafka-python's one IO loop. Never for Produce: the batches of one
partition must reach the broker in order.

This module touches kafka-python's connection internals (pinned in pyproject), like :mod:`kafka2pc.cluster_client`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from kafka.net.connection import KafkaConnection

log = logging.getLogger(__name__)

#: connections per broker for a round of coordinator requests (the broker's request handlers default to 8)
DEFAULT_WIDTH = 8


class ConnectionLanes:
    """Lane 0 of a broker is the connection manager's own connection; lanes 1.. are opened on first use and kept."""

    def __init__(self, manager: Any, width: int = DEFAULT_WIDTH):
        if width < 1:
            raise ValueError(f"width must be at least 1, not {width}")
        self._manager = manager
        self.width = width
        self._lanes: dict[tuple[int, int], Any] = {}

    def assign(self, nodes: Sequence[int]) -> list[int]:
        """The lane of each request, in order, given the node each goes to: round robin per node."""
        counts: dict[int, int] = {}
        lanes = []
        for node in nodes:
            index = counts.get(node, 0)
            counts[node] = index + 1
            lanes.append(index % self.width)
        return lanes

    def send(self, request: Any, node_id: int, lane: int) -> Any:
        """Send ``request`` on lane ``lane`` of ``node_id``; returns kafka-python's future. Runs on the IO loop."""
        conn = self._connection(node_id, lane) if lane else None
        if conn is None:  # lane 0, or a broker the metadata does not know: the manager's connection says why
            return self._manager.send(request, node_id=node_id)
        return conn.send_request(request)

    def _connection(self, node_id: int, lane: int) -> Any:
        key = (node_id, lane)
        conn = self._lanes.get(key)
        if conn is not None and not conn.closed:
            return conn
        node = self._manager.cluster.broker_metadata(node_id)
        if node is None:
            return None
        conn = KafkaConnection(self._manager._net, node_id=node_id,
                               broker_version_data=self._manager.broker_version_data, **self._manager.config)
        self._lanes[key] = conn
        conn.close_future.add_both(lambda _: self._forget(key, conn))
        timeout_at = time.monotonic() + self._manager.socket_connection_setup_timeout_ms(node_id) / 1000
        # requests sent before the connection is set up are buffered by it and go out once it is
        self._manager._net.call_soon(
            lambda: self._manager._connect(node, conn, reset_backoff_on_connect=False, timeout_at=timeout_at))
        log.debug("opened lane %d to broker %d", lane, node_id)
        return conn

    def _forget(self, key: tuple[int, int], conn: Any) -> None:
        if self._lanes.get(key) is conn:
            del self._lanes[key]

    def close(self) -> None:
        """Close every extra connection. Runs on the IO loop."""
        for conn in list(self._lanes.values()):
            conn.close()
        self._lanes.clear()

