"""The series of bounded labels exist at 0 from import (so ``increase()`` sees their first event), in a fresh process:
in the default registry, and in prometheus_client's multiprocess mode as its collector reads the files."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from kafka2pc import metrics
from kafka2pc._core.judge import TransactionOutcome

READ = """
import json, sys
from prometheus_client import CollectorRegistry, REGISTRY
multiprocess = sys.argv[1] == "multiprocess"
from kafka2pc import metrics
registry = REGISTRY
if multiprocess:
    from prometheus_client import multiprocess as mp
    registry = CollectorRegistry()
    mp.MultiProcessCollector(registry)
print(json.dumps({
    "outcome": {o: registry.get_sample_value("kafka2pc_transactions_ended_total", {"outcome": o})
                for o in metrics.OUTCOMES},
    "reason": {r: registry.get_sample_value("kafka2pc_two_phase_commit_fallbacks_total", {"reason": r})
               for r in metrics.FALLBACK_REASONS},
}))
"""


def series_after_import(mode: str, env: dict[str, str] | None = None) -> dict[str, dict[str, float | None]]:
    done = subprocess.run([sys.executable, "-c", READ, mode], capture_output=True, text=True, timeout=60, env=env,
                          check=True)
    return json.loads(done.stdout)


def test_every_outcome_and_fallback_reason_is_a_series_at_0_after_import():
    found = series_after_import("default")
    assert found == {"outcome": dict.fromkeys(metrics.OUTCOMES, 0.0),
                     "reason": dict.fromkeys(metrics.FALLBACK_REASONS, 0.0)}


def test_under_the_multiprocess_mode_too(tmp_path):
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    found = series_after_import("multiprocess", env)
    assert found == {"outcome": dict.fromkeys(metrics.OUTCOMES, 0.0),
                     "reason": dict.fromkeys(metrics.FALLBACK_REASONS, 0.0)}


def test_the_pre_created_labels_cover_every_value_the_code_gives():
    assert {outcome.value for outcome in TransactionOutcome} <= set(metrics.OUTCOMES)
    reasons = ["broker advertises InitProducerId up to v5", "transaction.two.phase.commit.enable=false",
               "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", "the cluster no longer advertises v6", "anything else"]
    assert {metrics.fallback_reason(r) for r in reasons} | {"sink_batch"} == set(metrics.FALLBACK_REASONS)


def test_a_multiprocess_folder_that_does_not_exist_never_fails_the_import(tmp_path):
    """The kafka2pc CLI imports the package: a shell whose PROMETHEUS_MULTIPROC_DIR points nowhere must still run it
    (the series at 0 are then left out; the first metric recorded fails, as it did before they existed)."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "missing")}
    done = subprocess.run([sys.executable, "-c", "import kafka2pc.metrics; print('imported')"], capture_output=True,
                          text=True, timeout=60, env=env, check=False)
    assert (done.returncode, done.stdout.strip()) == (0, "imported"), done.stderr[-2000:]
