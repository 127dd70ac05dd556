"""Long chaos run (marked slow; `make chaos`): the sink workload on the 3-node cluster while both the job process and
brokers are SIGKILLed at random, in the spirit of Kafka's transactions system test. Bounded: a fixed number of
rounds, each with a time limit."""

import json
import os
import random
import signal
import subprocess
import time
import uuid

import pytest

from kafka2pc.sink.integration import FileDecisionLog
from kafka2pc.transaction_control import OPEN_STATES
from tests.integration.producer_support import REPO
from tests.integration.sink_support import workload_command
from tests.integration.test_sink_recovery import check_exactly_once, control_for, ids_of

pytestmark = [pytest.mark.integration, pytest.mark.cluster, pytest.mark.slow]

ROUNDS = 15
CHECKPOINTS = 300
SUBTASKS = 6


def test_sink_exactly_once_under_job_and_broker_kills(kafka_3node, topic_factory, tmp_path):
    rng = random.Random(2024)
    prefix = f"chaos3n{uuid.uuid4().hex[:6]}"
    topic = topic_factory(kafka_3node, partitions=6, replication_factor=3)
    log_dir = tmp_path / "decisions"
    cmd = workload_command(kafka_3node.bootstrap_servers, prefix, topic, log_dir, subtasks=SUBTASKS,
                           checkpoints=CHECKPOINTS, records=4)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    broker_kills = job_kills = job_failures = 0
    for _ in range(ROUNDS):
        job = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(rng.uniform(1.0, 4.0))
        victim = None
        if rng.random() < 0.6:
            victim = rng.choice(kafka_3node.node_ids)
            kafka_3node.kill_node(victim)
            broker_kills += 1
            time.sleep(rng.uniform(0.5, 3.0))
        if job.poll() is None:
            job.send_signal(signal.SIGKILL)
            job_kills += 1
        job.communicate(timeout=60)
        if job.returncode not in (0, -signal.SIGKILL):
            job_failures += 1  # a broker kill can make the job give up: that is one more crash
        if victim is not None:
            kafka_3node.start_node(victim)
            kafka_3node.wait_ready()
    final = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert final.returncode == 0, final.stderr[-3000:]
    events = [json.loads(line) for line in final.stdout.splitlines() if line.startswith("{")]
    assert events[-1]["event"] == "finished"
    print(f"\n{job_kills} job kills, {broker_kills} broker kills, {job_failures} job failures")

    log = FileDecisionLog(log_dir, prefix, retain_done=None)
    check_exactly_once(kafka_3node.bootstrap_servers, topic, log, checkpoints=CHECKPOINTS, subtasks=SUBTASKS,
                       records=4)
    client, control = control_for(kafka_3node.bootstrap_servers)
    with client:
        assert ids_of(control, prefix, OPEN_STATES) == []
        assert len(ids_of(control, prefix)) <= 3 * SUBTASKS
