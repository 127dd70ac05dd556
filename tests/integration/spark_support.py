"""What the Spark sink tests share: orders into a source topic (``produce_orders``), the audit of a sink topic, the
open transactions under a sink's prefix."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from kafka2pc.audit import RecordDecoder, audit_topic
from kafka2pc.cluster import ClusterClient
from kafka2pc.config import ClientConfig
from kafka2pc.sink.integration import TransactionalIdGrammar
from kafka2pc.spark.state import SinkStore
from kafka2pc.testing.verify import produce_orders
from kafka2pc.transaction_control import OPEN_STATES, TransactionControl


def audit(bootstrap: str | dict, topic: str, expected: int) -> dict:
    """``kafka2pc audit``'s figures for ``topic``, ids expected to be exactly 0 .. expected - 1 (``bootstrap``: the
    servers, or a whole client config in either client's keys)."""
    settings = {"bootstrap.servers": bootstrap} if isinstance(bootstrap, str) else bootstrap
    report = audit_topic(settings, topic, RecordDecoder(id_field="id"),
                         expect_range=(0, expected - 1))
    return report.to_json_dict()


def open_transactions(bootstrap: str, prefix: str, settle_s: float = 10.0) -> list[str]:
    """The transactional ids under ``prefix`` with a transaction open, once those being ended have ended (their
    markers take a moment; at most ``settle_s``)."""
    grammar = TransactionalIdGrammar(prefix)
    with ClusterClient(ClientConfig.for_bootstrap(bootstrap)) as client:
        deadline = time.monotonic() + settle_s
        while True:
            listed = [t for t in TransactionControl(client).list(states=OPEN_STATES)
                      if grammar.owns(t.transactional_id)]
            if all(t.state == "Ongoing" for t in listed) or time.monotonic() > deadline:
                return sorted(t.transactional_id for t in listed)
            time.sleep(0.1)


def wait_for_open_transaction(bootstrap: str, prefix: str, timeout_s: float) -> str:
    """Return as soon as ListTransactions shows a transaction open under ``prefix`` (its id); AssertionError after
    ``timeout_s``. One connection, polled every 20 ms, so a caller can act while the transaction is still open."""
    grammar = TransactionalIdGrammar(prefix)
    with ClusterClient(ClientConfig.for_bootstrap(bootstrap)) as client:
        control = TransactionControl(client)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = [t.transactional_id for t in control.list(states=["Ongoing"], pattern=f"^{grammar.pattern}$")
                     if grammar.owns(t.transactional_id)]
            if found:
                return found[0]
            time.sleep(0.02)
    raise AssertionError(f"no transaction opened under {prefix!r} within {timeout_s:g} s")


def sink_prefix(checkpoint: Path) -> str:
    """The prefix the checkpoint pinned."""
    state = SinkStore(str(checkpoint)).load()
    assert state is not None, f"no sink state under {checkpoint}"
    return state.prefix


def wait_for(what: str, condition: Callable[[], object], timeout_s: float) -> None:
    """Poll ``condition`` until it is true; AssertionError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


__all__ = ["audit", "open_transactions", "produce_orders", "sink_prefix", "wait_for", "wait_for_open_transaction"]
