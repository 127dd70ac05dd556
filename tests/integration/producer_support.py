"""Helpers shared by the TwoPhaseProducer integration tests."""

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from kafka2pc import TwoPhaseProducer

REPO = Path(__file__).resolve().parents[2]


def new_txn_id(prefix: str = "it") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def producer(bootstrap: str, txn_id: str, *, two_phase_commit: bool = True, **extra) -> TwoPhaseProducer:
    return TwoPhaseProducer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, **extra},
                            two_phase_commit=two_phase_commit)


def crash_writer(bootstrap: str, txn_id: str, topic: str, *, stage: str, count: int = 100,
                 two_phase_commit: bool = True, config_file: Path | None = None) -> dict:
    """Run crash_writer.py, wait for its state line, SIGKILL it, and return what it printed."""
    cmd = [sys.executable, "-m", "tests.integration.crash_writer", "--bootstrap", bootstrap, "--transactional-id",
           txn_id, "--topic", topic, "--count", str(count), "--stage", stage]
    if two_phase_commit:
        cmd.append("--two-phase-commit")
    if config_file is not None:
        cmd += ["--config", str(config_file)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"crash writer exited early: {proc.stderr.read()}")
        report = json.loads(line)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    return report
