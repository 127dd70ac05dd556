"""The sink's own state under a checkpoint location: the prefix it pins on the first run, and its decision log."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from kafka2pc.errors import ConfigError, DecisionLogCorruptError, SinkStateMissingError
from kafka2pc.spark.state import SinkState, SinkStore
from kafka2pc.transaction_control import TransactionListing


def control(*listed: str):
    asked = []

    def list_(**kwargs):
        asked.append(kwargs)
        return [TransactionListing(txn_id, 1, "CompleteCommit") for txn_id in listed]

    return SimpleNamespace(list=list_, asked=asked)


def test_the_first_run_pins_a_generated_prefix_and_later_runs_keep_it(tmp_path):
    store = SinkStore(str(tmp_path))
    seen = control()
    state = store.open(None, lambda: seen)
    assert state.prefix.startswith("kafka2pc-") and seen.asked  # checked free on the cluster
    again = control()
    assert store.open(None, lambda: again) == state and again.asked == []  # not asked again
    assert json.loads(Path(store.state_file).read_text())["prefix"] == state.prefix


def test_a_given_prefix_must_match_what_the_checkpoint_holds(tmp_path):
    store = SinkStore(str(tmp_path))
    store.open("orders", control)
    with pytest.raises(ConfigError, match="differs from 'orders'"):
        store.open("payments", control)


def test_a_prefix_with_ids_on_the_cluster_is_refused_on_the_first_run(tmp_path):
    with pytest.raises(ConfigError, match="already has 1 transactional ids"):
        SinkStore(str(tmp_path)).open("orders", lambda: control("orders-0-3", "orders0-0-0"))
    assert not Path(SinkStore(str(tmp_path)).state_file).exists()


def test_an_unreadable_state_file_is_an_error_not_a_fresh_start(tmp_path):
    store = SinkStore(str(tmp_path))
    store.save(SinkState("orders"))
    Path(store.state_file).write_text("{")
    with pytest.raises(DecisionLogCorruptError, match="unreadable sink state"):
        store.load()


def test_the_query_id_comes_from_sparks_metadata_file(tmp_path):
    (tmp_path / "metadata").write_text('{"id":"1f6c"}\n')
    assert SinkStore(str(tmp_path)).query_id() == "1f6c"
    assert SinkStore(str(tmp_path / "none")).query_id() is None


def test_a_checkpoint_with_spark_commits_and_no_sink_state_is_an_error_never_a_new_prefix(tmp_path):
    (tmp_path / "commits").mkdir()
    for batch in ("0", "1", "7"):
        (tmp_path / "commits" / batch).write_text("v1\n{}")
    store = SinkStore(str(tmp_path))
    with pytest.raises(SinkStateMissingError, match=r"batches up to 7 committed.*kafka2pc/sink.json is missing"):
        store.open(None, control)
    assert not Path(store.state_file).exists()
    # a query that never wrote with kafka2pc (another sink until now) starts one with an explicit prefix
    assert store.open("orders", control).prefix == "orders"


def test_a_fresh_or_non_streaming_location_pins_a_prefix(tmp_path):
    (tmp_path / "commits").mkdir()  # a query's first batch: nothing committed yet
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "0").write_text("v1")
    assert SinkStore(str(tmp_path)).open(None, control).prefix.startswith("kafka2pc-")
