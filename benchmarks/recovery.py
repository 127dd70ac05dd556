"""Sink recovery: how long LISTING recovery takes after 1, 5 and 10 consecutive crashed restarts of a P=8 job, and
how many transactional ids the broker holds after 1000 checkpoints with POOLING and with INCREMENTING.

    python benchmarks/recovery.py [--bootstrap HOST:PORT] [--subtasks 8] [--checkpoints 1000] [--crashes 1,5,10]
                                  [--recovery-only]

Each crashed restart is a real process running the sink workload: it recovers from the previous crash, then its P
subtasks prepare the transactions of a new checkpoint, and it is SIGKILLed before the decision, leaving P open
transactions behind. The recovery after the last crash is timed in this process (ListTransactions on every broker,
roll-forward, aborts). With PROBING the work of that recovery would grow with every failed restart; with LISTING it
depends only on what is open.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from kafka2pc.cluster import ClusterClient
from kafka2pc.config import ClientConfig
from kafka2pc.sink.integration import FileDecisionLog, TransactionalIdGrammar, TransactionNamingStrategy, recover
from kafka2pc.testing.provider import bootstrap_or_local
from kafka2pc.testing.verify import create_topic
from kafka2pc.transaction_control import TransactionControl
from kafka2pc_harness.sink_workload import run_job


def crash_once(bootstrap: str, prefix: str, topic: str, log_dir: Path, subtasks: int) -> None:
    """Run the workload (it recovers first) until its subtasks have prepared the transactions of a new checkpoint,
    then SIGKILL it before the decision: P prepared, undecided transactions are left open."""
    cmd = [sys.executable, "-m", "kafka2pc_harness.sink_workload", "--bootstrap", bootstrap, "--prefix", prefix,
           "--topic", topic, "--log-dir", str(log_dir), "--subtasks", str(subtasks), "--checkpoints", "1000000",
           "--records", "3"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        for line in proc.stdout or ():
            if json.loads(line)["event"] == "prepared":
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)


def recovery_after_crashes(bootstrap: str, subtasks: int, crashes: int) -> tuple[float, int]:
    prefix = f"rb{crashes}x{uuid.uuid4().hex[:6]}"
    topic = create_topic(bootstrap, partitions=4)
    with tempfile.TemporaryDirectory() as log_dir:
        for _ in range(crashes):  # bounded
            crash_once(bootstrap, prefix, topic, Path(log_dir), subtasks)
        with ClusterClient(ClientConfig.for_bootstrap(bootstrap)) as client:
            report = recover(TransactionControl(client), prefix, FileDecisionLog(log_dir, prefix))
    return report.seconds, len(report.aborted)


def ids_after(bootstrap: str, strategy: TransactionNamingStrategy, subtasks: int, checkpoints: int) -> int:
    prefix = f"ids{strategy.value[:4]}{uuid.uuid4().hex[:6]}"
    topic = create_topic(bootstrap, partitions=4)
    with tempfile.TemporaryDirectory() as log_dir:
        started = time.monotonic()
        run_job(bootstrap, prefix, topic, log_dir, subtasks=subtasks, checkpoints=checkpoints, records=1,
                strategy=strategy, emit=lambda event: None)
        elapsed = time.monotonic() - started
    grammar = TransactionalIdGrammar(prefix)
    with ClusterClient(ClientConfig.for_bootstrap(bootstrap)) as client:
        held = [t for t in TransactionControl(client).list() if grammar.owns(t.transactional_id)]
    print(f"  {strategy.name:12s} {checkpoints} checkpoints x {subtasks} subtasks in {elapsed:5.1f} s: "
          f"{len(held)} transactional ids held by the broker", flush=True)
    return len(held)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap")
    parser.add_argument("--subtasks", type=int, default=8)
    parser.add_argument("--checkpoints", type=int, default=1000)
    parser.add_argument("--crashes", default="1,5,10", help="comma-separated numbers of crashed restarts")
    parser.add_argument("--recovery-only", action="store_true", help="skip the POOLING/INCREMENTING id count")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    with bootstrap_or_local(args.bootstrap) as bootstrap:
        print(f"recovery time, P={args.subtasks}, after consecutive crashed restarts (broker {bootstrap}):")
        for crashes in (int(n) for n in args.crashes.split(",")):
            seconds, aborted = recovery_after_crashes(bootstrap, args.subtasks, crashes)
            print(f"  after {crashes:2d} crash(es): recovery {seconds * 1000:7.1f} ms, "
                  f"{aborted} lingering transactions aborted", flush=True)
        if args.recovery_only:
            return 0
        print("\ntransactional ids the broker holds:")
        counts = {s: ids_after(bootstrap, s, args.subtasks, args.checkpoints) for s in TransactionNamingStrategy}
        pooling, incrementing = counts[TransactionNamingStrategy.POOLING], counts[
            TransactionNamingStrategy.INCREMENTING]
        print(f"  INCREMENTING / POOLING = {incrementing / pooling:.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
