"""A simulated sink job for chaos tests and benchmarks: P subtasks write, prepare and commit N checkpoints through
the sink core, recovering first. Run it (``python -m kafka2pc_harness.sink_workload``), SIGKILL it anywhere, run it
again: it continues from its decision log. Each record is JSON ``{"c": checkpoint, "s": subtask, "i": index,
"a": attempt}``; the decision of each checkpoint stores the attempt that wrote it, so a checker can tell decided
records from undecided ones."""

from __future__ import annotations

import argparse
import json
import logging
import uuid
from collections.abc import Callable
from typing import Any

from kafka2pc.cluster import ClusterClient
from kafka2pc.config import ClientConfig
from kafka2pc.sink.integration import (
    Committer,
    Decision,
    FileDecisionLog,
    SubtaskWriter,
    TransactionalIdPool,
    TransactionNamingStrategy,
    recover,
)
from kafka2pc.transaction_control import TransactionControl


def restored_pools(log: FileDecisionLog, prefix: str, subtasks: int, strategy: TransactionNamingStrategy,
                   known_ids: tuple[str, ...]) -> list[TransactionalIdPool]:
    """The subtasks' id pools after recovery: as stored with the last decision, all free, plus every id of the
    prefix the brokers know."""
    last = log.last_checkpoint()
    decision = log.decision(last) if last is not None else None
    stored = decision.metadata.get("pools", {}) if decision is not None else {}
    pools = []
    for subtask in range(subtasks):
        text = stored.get(str(subtask))
        pool = TransactionalIdPool.from_json(text) if text else TransactionalIdPool(prefix, subtask, strategy)
        pools.append(pool.release_all().adopt(list(known_ids)))
    return pools


def _print_event(event: dict[str, Any]) -> None:
    print(json.dumps(event), flush=True)


def run_job(bootstrap: str, prefix: str, topic: str, log_dir: str, *, subtasks: int, checkpoints: int, records: int,
            strategy: TransactionNamingStrategy, emit: Callable[[dict[str, Any]], None] = _print_event) -> None:
    """Recover, then run checkpoints from the one after the last decided up to ``checkpoints``; ``emit`` gets one
    event per step (by default printed as a JSON line)."""
    attempt = uuid.uuid4().hex[:8]
    client = ClusterClient(ClientConfig.for_bootstrap(bootstrap))
    control = TransactionControl(client)
    log = FileDecisionLog(log_dir, prefix, retain_done=None)
    report = recover(control, prefix, log)
    emit({"event": "recovered", "attempt": attempt, "rolled_forward": report.checkpoints_rolled_forward,
          "aborted": report.aborted, "seconds": report.seconds})

    pools = restored_pools(log, prefix, subtasks, strategy, report.known_ids)
    writers = [SubtaskWriter({"bootstrap.servers": bootstrap}, prefix, s, cluster=client, pool=pools[s],
                             strategy=strategy) for s in range(subtasks)]
    committer = Committer(control, log)
    for checkpoint in range((log.last_checkpoint() or 0) + 1, checkpoints + 1):
        for subtask, writer in enumerate(writers):
            writer.write(topic, [json.dumps({"c": checkpoint, "s": subtask, "i": i, "a": attempt}).encode()
                                 for i in range(records)])
        prepared = [p for p in (w.prepare(checkpoint) for w in writers) if p is not None]
        emit({"event": "prepared", "c": checkpoint})
        pools_now = {str(w.pool.subtask): w.pool.to_json() for w in writers}
        committer.commit(Decision(checkpoint, prepared, {"attempt": attempt, "pools": pools_now}))
        for writer in writers:
            writer.release(prepared)
        emit({"event": "checkpoint", "c": checkpoint})
    emit({"event": "finished", "attempt": attempt})
    client.close()


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--subtasks", type=int, default=4)
    parser.add_argument("--checkpoints", type=int, default=200)
    parser.add_argument("--records", type=int, default=5)
    parser.add_argument("--strategy", default="pooling")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    run_job(args.bootstrap, args.prefix, args.topic, args.log_dir, subtasks=args.subtasks,
            checkpoints=args.checkpoints, records=args.records, strategy=TransactionNamingStrategy(args.strategy))


if __name__ == "__main__":
    main()
