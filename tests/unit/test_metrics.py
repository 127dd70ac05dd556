"""kafka2pc.metrics' table of open transactions behind kafka2pc_oldest_open_transaction_seconds: read live when the
gauge is scraped, written for prometheus_client's multiprocess mode, and what a listing replaces; the bounded
labels."""

from __future__ import annotations

import os
import subprocess
import sys

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from kafka2pc import metrics


class Clock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


def table() -> tuple[metrics.OpenTransactions, Clock, CollectorRegistry]:
    registry, clock = CollectorRegistry(), Clock()
    gauge = Gauge("oldest_open", "test", ["prefix"], registry=registry)
    return metrics.OpenTransactions(gauge, clock=clock), clock, registry


def scraped(registry: CollectorRegistry, prefix: str) -> float | None:
    return registry.get_sample_value("oldest_open", {"prefix": prefix})


def test_the_oldest_per_prefix_is_computed_when_scraped():
    open_, clock, registry = table()
    open_.opened("a", "sink", "a-0-0")
    clock.now += 5
    open_.opened("a", "dual_write", "a-1")
    open_.opened("b", "sink", "b-0-0", since=clock.now - 100)
    clock.now += 2
    assert (scraped(registry, "a"), scraped(registry, "b")) == (7, 102)  # no write since: read at the scrape
    open_.closed("a", "sink", "a-0-0")
    assert scraped(registry, "a") == 2
    open_.closed("a", "dual_write", "a-1")
    assert scraped(registry, "a") == 0  # the series stays, at 0: an alert sees it resolve
    open_.closed("a", "dual_write", "never-known")  # nothing happens
    assert scraped(registry, "a") == 0


def test_found_keeps_the_start_it_knew_and_asks_for_one_only_when_new():
    open_, clock, registry = table()
    asked = []
    open_.opened("p", "sink", "p-0-0", since=clock.now - 30)
    open_.found("p", "sink", "p-0-0", lambda: asked.append(1) or 0.0)
    assert asked == [] and scraped(registry, "p") == 30
    open_.found("p", "sink", "p-1-0", lambda: None)  # start unknown: from now
    clock.now += 1
    assert scraped(registry, "p") == 31


def test_a_listing_replaces_what_the_process_counts_for_its_prefix_and_path_only():
    open_, clock, registry = table()
    open_.opened("p", "sink", "p-0-0", since=clock.now - 50)   # settled elsewhere meanwhile
    open_.opened("p", "sink", "p-1-0", since=clock.now - 20)   # still open: keeps its start
    open_.opened("p", "dual_write", "p-7", since=clock.now - 9)  # another engine's id under the same prefix
    open_.retain("p", "sink", ["p-1-0", "p-2-0"])  # p-2-0 not known yet: counted from now
    assert scraped(registry, "p") == 20
    clock.now += 25
    assert scraped(registry, "p") == 45
    open_.retain("p", "sink", [])
    assert scraped(registry, "p") == 34  # p-7's 9 s, and 25 more


def test_a_clock_behind_the_brokers_never_gives_a_negative_age():
    open_, clock, registry = table()
    open_.opened("p", "sink", "p-0-0", since=clock.now + 3)
    assert scraped(registry, "p") == 0


WORKER = """
import os, sys
from kafka2pc import metrics
clock = [1000.0]
table = metrics.OpenTransactions(metrics.OLDEST_OPEN_TRANSACTION, clock=lambda: clock[0])
table.opened("mp", "dual_write", "mp-0", since=958.0)
clock[0] = 1060.0
if sys.argv[1] == "refresh":
    table.refresh()
print(os.getpid())
"""


def test_under_the_multiprocess_mode_the_ages_written_are_the_last_refreshed_and_a_dead_workers_go(tmp_path):
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))
    stale = subprocess.run([sys.executable, "-c", WORKER, "no-refresh"], env=env, capture_output=True, text=True,
                           check=True, timeout=60)
    assert registry.get_sample_value("kafka2pc_oldest_open_transaction_seconds", {"prefix": "mp"}) == 42
    mark_process_dead(int(stale.stdout.strip()), path=str(tmp_path))
    fresh = subprocess.run([sys.executable, "-c", WORKER, "refresh"], env=env, capture_output=True, text=True,
                           check=True, timeout=60)
    assert registry.get_sample_value("kafka2pc_oldest_open_transaction_seconds", {"prefix": "mp"}) == 102
    mark_process_dead(int(fresh.stdout.strip()), path=str(tmp_path))  # gunicorn's child_exit hook does this
    assert registry.get_sample_value("kafka2pc_oldest_open_transaction_seconds", {"prefix": "mp"}) is None


def test_labels_stay_bounded():
    assert metrics.sink_prefix("orders-sink-3-17") == "orders-sink"
    assert metrics.sink_prefix("job-10-0-1") == "job-10"
    assert metrics.sink_prefix("orders-3") is None and metrics.sink_prefix("job-1-0-03") is None
    assert metrics.fallback_reason("something new the core says") == "other"
    assert set(metrics.FALLBACK_REASONS) >= {"no_v6", "config_off", "acl", "turned_off", "other"}
