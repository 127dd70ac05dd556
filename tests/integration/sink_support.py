"""Helpers for the sink-core integration tests: run the workload, leave lingering transactions behind."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.integration.producer_support import REPO

PLAIN_WRITER = """
import sys, time
from confluent_kafka import Producer
bootstrap, topic = sys.argv[1], sys.argv[2]
for txn_id in sys.argv[3:]:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, value=txn_id.encode())
    p.flush(30)
print("ready", flush=True)
time.sleep(120)
"""


def leave_lingering(bootstrap: str, topic: str, transactional_ids: list[str]) -> None:
    """Open one transaction per id with plain confluent-kafka producers in a process, then SIGKILL it."""
    proc = subprocess.Popen([sys.executable, "-c", PLAIN_WRITER, bootstrap, topic, *transactional_ids],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.strip() == "ready", proc.stderr.read()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)


def workload_command(bootstrap: str, prefix: str, topic: str, log_dir: Path, **options) -> list[str]:
    cmd = [sys.executable, "-m", "kafka2pc_harness.sink_workload", "--bootstrap", bootstrap, "--prefix", prefix,
           "--topic", topic, "--log-dir", str(log_dir)]
    for key, value in options.items():
        cmd += [f"--{key.replace('_', '-')}", str(value)]
    return cmd


def _kill_at_random_point(proc: subprocess.Popen, rng: random.Random, events: list[dict]) -> bool:
    """SIGKILL ``proc`` at a random point: during start-up and recovery (1 in 5), or a random short delay after a
    random number (1-12) of completed checkpoints, which lands in writing, preparing, recording or completing.
    Returns whether it was killed before finishing."""
    if rng.random() < 0.2:
        time.sleep(rng.uniform(0.0, 1.0))
    else:
        target = rng.randint(1, 12)
        while target:
            line = proc.stdout.readline()
            if not line:
                break
            event = json.loads(line)
            events.append(event)
            target -= event["event"] == "checkpoint"
        time.sleep(rng.uniform(0.0, 0.05))
    if proc.poll() is not None:
        return False
    proc.send_signal(signal.SIGKILL)
    return True


def run_with_crashes(cmd: list[str], *, crashes: int, seed: int) -> tuple[int, list[dict]]:
    """Start ``cmd`` and SIGKILL it at a random point, ``crashes`` times; then let one run finish.
    Returns how many runs were really killed mid-way, and every event line the runs printed."""
    rng = random.Random(seed)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    killed, events = 0, []
    for _ in range(crashes):  # bounded
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        killed += _kill_at_random_point(proc, rng, events)
        out, err = proc.communicate(timeout=120)
        events += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        if proc.returncode not in (0, -signal.SIGKILL):
            raise AssertionError(f"workload failed ({proc.returncode}):\n{err[-3000:]}")
    final = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert final.returncode == 0, final.stderr[-3000:]
    events += [json.loads(line) for line in final.stdout.splitlines() if line.startswith("{")]
    return killed, events
