"""Which producers hold a topic's last stable offset back: DescribeProducers to the partition leaders, named by
transactional id where ListTransactions knows them."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import kafka.errors as kafka_errors
from kafka.protocol.admin.transactions import DescribeProducersRequest

from kafka2pc.audit.report import OpenTransaction
from kafka2pc.cluster import ClusterClient
from kafka2pc.config import ClientConfig
from kafka2pc.errors import Kafka2pcError
from kafka2pc.transaction_control import OPEN_STATES, TransactionControl


def describe_open_transactions(settings: Mapping[str, object], topic: str, partitions: Sequence[int],
                               deadline: float) -> tuple[dict[int, tuple[OpenTransaction, ...]], list[str]]:
    """Per partition, the producers with an ongoing transaction (DescribeProducers to the partition leader), named
    by transactional id where ListTransactions knows them; and notes on what could not be found out."""
    notes: list[str] = []
    found: dict[int, list[OpenTransaction]] = {}
    bootstrap_s = max(1.0, min(30.0, deadline - time.monotonic()))
    with ClusterClient(ClientConfig.from_dict(settings), bootstrap_timeout_s=bootstrap_s) as client:
        if client.broker_max_version(DescribeProducersRequest) < 0:
            return {}, ["the broker does not support DescribeProducers: open transactions not identified"]
        leaders = client.partition_leaders(topic)
        by_leader: dict[int, list[int]] = {}
        for partition in partitions:
            leader = leaders.get(partition, -1)
            if leader < 0:
                notes.append(f"partition {partition} has no leader: open transactions not identified")
            else:
                by_leader.setdefault(leader, []).append(partition)
        for leader, wanted in sorted(by_leader.items()):
            response = client.send_idempotent(_describe_producers(topic, wanted), leader, what="DescribeProducers")
            for entry in (p for t in response.topics if t.name == topic for p in t.partitions):
                if entry.error_code != 0:
                    notes.append(f"DescribeProducers on partition {entry.partition_index}: "
                                 f"{kafka_errors.for_code(entry.error_code).message}")
                    continue
                found[entry.partition_index] = [
                    OpenTransaction(s.producer_id, s.producer_epoch, s.current_txn_start_offset)
                    for s in entry.active_producers if s.current_txn_start_offset >= 0]
        if any(found.values()):
            try:
                listed = {t.producer_id: t for t in TransactionControl(client).list(states=OPEN_STATES)}
            except Kafka2pcError as exc:
                listed = {}
                notes.append(f"transactional ids not identified: {exc}")
            found = {p: [attrs.evolve(t, transactional_id=listed[t.producer_id].transactional_id,
                                      state=listed[t.producer_id].state) if t.producer_id in listed else t
                         for t in txns] for p, txns in found.items()}
    return {p: tuple(sorted(t, key=lambda o: o.start_offset)) for p, t in found.items()}, notes


def _describe_producers(topic: str, partitions: Sequence[int]) -> Any:
    def make() -> Any:
        return DescribeProducersRequest(topics=[DescribeProducersRequest.TopicRequest(
            name=topic, partition_indexes=list(partitions))])

    return make
