"""`kafka2pc txns` against lingering transactions on a real broker."""

import json
import subprocess
import sys
import time
import uuid

import pytest

from kafka2pc.testing.verify import end_offsets
from tests.integration.sink_support import leave_lingering

pytestmark = pytest.mark.integration


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kafka2pc.cli", "txns", *args], capture_output=True, text=True,
                          timeout=120, check=False, input=stdin)


def test_txns_commands_on_lingering_transactions(kafka, topic_factory):
    bootstrap = kafka.bootstrap_servers
    tag = uuid.uuid4().hex[:6]
    prefix = f"ops{tag}"
    ours = [f"{prefix}-0-0", f"{prefix}-1-4", f"{prefix}-2-9"]
    look_alike = f"{prefix}0-0-0"
    topic = topic_factory(kafka)
    leave_lingering(bootstrap, topic, [*ours, look_alike])

    listed = json.loads(cli("list", "--bootstrap", bootstrap, "--prefix", prefix, "--json").stdout)
    assert sorted(t["transactional_id"] for t in listed) == ours
    assert {t["state"] for t in listed} == {"Ongoing"}
    table = cli("list", "--bootstrap", bootstrap, "--prefix", prefix, "--state", "Ongoing").stdout
    assert table.splitlines()[0].split() == ["TRANSACTIONAL_ID", "STATE", "PRODUCER_ID"]
    time.sleep(1.5)
    older = json.loads(cli("list", "--bootstrap", bootstrap, "--prefix", prefix, "--older-than", "1s",
                           "--json").stdout)
    assert len(older) == 3
    assert json.loads(cli("list", "--bootstrap", bootstrap, "--prefix", prefix, "--older-than", "1h",
                          "--json").stdout) == []

    described = json.loads(cli("describe", "--bootstrap", bootstrap, ours[0], "--json").stdout)
    assert described[0]["state"] == "Ongoing"
    assert described[0]["partitions"] == [f"{topic}-0"]
    assert described[0]["age_ms"] >= 1000

    hanging = json.loads(cli("find-hanging", "--bootstrap", bootstrap, "--prefix", prefix, "--older-than", "1s",
                             "--json").stdout)
    assert sorted(h["transactional_id"] for h in hanging) == ours
    default_threshold = cli("find-hanging", "--bootstrap", bootstrap, "--prefix", prefix)
    assert "older than 1200000 ms" in default_threshold.stdout  # 15 min max timeout + 5 min
    assert "(none)" in default_threshold.stdout

    dry = cli("abort", "--bootstrap", bootstrap, "--prefix", prefix, "--keep", ours[2], "--dry-run")
    assert dry.returncode == 0
    assert f"would abort: {ours[0]}" in dry.stdout and f"kept: {ours[2]}" in dry.stdout
    refused = cli("abort", "--bootstrap", bootstrap, "--prefix", prefix, stdin="")
    assert refused.returncode == 1 and "pass --yes" in refused.stderr
    still = json.loads(cli("list", "--bootstrap", bootstrap, "--prefix", prefix, "--state", "Ongoing",
                           "--json").stdout)
    assert len(still) == 3  # dry run and refusal aborted nothing

    done = cli("abort", "--bootstrap", bootstrap, "--prefix", prefix, "--keep", ours[2], "--yes")
    assert done.returncode == 0, done.stderr
    assert "2 transaction(s) aborted" in done.stdout
    remaining = json.loads(cli("list", "--bootstrap", bootstrap, "--state", "Ongoing", "--json").stdout)
    open_ids = {t["transactional_id"] for t in remaining}
    assert ours[2] in open_ids and look_alike in open_ids
    assert not {ours[0], ours[1]} & open_ids

    by_id = cli("abort", "--bootstrap", bootstrap, ours[2], look_alike, "nonexistent-0-0", "--yes")
    assert by_id.returncode == 0 and "2 transaction(s) aborted" in by_id.stdout
    assert "nonexistent-0-0: no open transaction" in by_id.stderr
    assert end_offsets(bootstrap, topic) == end_offsets(bootstrap, topic, isolation="read_uncommitted")


def test_txns_usage_errors(kafka):
    both = cli("abort", "--bootstrap", kafka.bootstrap_servers, "x-0-0", "--prefix", "x", "--yes")
    assert both.returncode == 1 and "not both" in both.stderr
    bad_prefix = cli("list", "--bootstrap", kafka.bootstrap_servers, "--prefix", "bad prefix")
    assert bad_prefix.returncode == 1 and "transactional.id.prefix" in bad_prefix.stderr
    bad_duration = cli("list", "--bootstrap", kafka.bootstrap_servers, "--older-than", "soon")
    assert bad_duration.returncode == 2 and "expected a duration" in bad_duration.stderr
