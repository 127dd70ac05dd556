"""What the data plane hands the I/O edge, and what it needs from it: framed batches in Produce calls."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Protocol

import attrs

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


class ProduceTransport(Protocol):
    """What a producer's data plane needs from the cluster."""

    def partition_leaders(self, topic: str) -> dict[int, int]:
        """Partition -> leader node id; raises if the topic is unknown."""
        ...

    def max_message_bytes(self, topic: str) -> int | None:
        """The topic's effective max.message.bytes, None when it cannot be read."""
        ...

    def send_produce(self, calls: Sequence[ProduceCall]) -> Future[list[ProduceReply | Exception]]:
        """Send the calls concurrently; the future gives each reply, or the exception it failed with, in order."""
        ...
