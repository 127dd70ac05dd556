"""A simulated sink job for the recovery tests: P subtasks write, prepare and commit N checkpoints through the sink
core, recovering first. Run it, SIGKILL it anywhere, run it again: it continues from its decision log."""

import argparse
import json
import logging
import uuid

from kafka2pc.cluster_client import ClusterClient
from kafka2pc.config import ClientConfig
from kafka2pc.sink import (
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
    last = log.last_checkpoint()
    stored = log.decision(last).metadata.get("pools", {}) if last is not None else {}
    pools = []
    for subtask in range(subtasks):
        text = stored.get(str(subtask))
        pool = TransactionalIdPool.from_json(text) if text else TransactionalIdPool(prefix, subtask, strategy)
        pools.append(pool.release_all().adopt(list(known_ids)))
    return pools


def main() -> None:
    parser = argparse.ArgumentParser()
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
    attempt = uuid.uuid4().hex[:8]
    strategy = TransactionNamingStrategy(args.strategy)

    client = ClusterClient(ClientConfig.for_bootstrap(args.bootstrap))
    control = TransactionControl(client)
    log = FileDecisionLog(args.log_dir, args.prefix, retain_done=None)
    report = recover(control, args.prefix, log)
    print(json.dumps({"event": "recovered", "attempt": attempt, "rolled_forward": report.checkpoints_rolled_forward,
                      "aborted": report.aborted, "seconds": report.seconds}), flush=True)

    pools = restored_pools(log, args.prefix, args.subtasks, strategy, report.known_ids)
    writers = [SubtaskWriter({"bootstrap.servers": args.bootstrap}, args.prefix, s, cluster=client, pool=pools[s],
                             strategy=strategy) for s in range(args.subtasks)]
    committer = Committer(control, log)
    for checkpoint in range((log.last_checkpoint() or 0) + 1, args.checkpoints + 1):
        for subtask, writer in enumerate(writers):
            writer.write(args.topic, [json.dumps({"c": checkpoint, "s": subtask, "i": i, "a": attempt}).encode()
                                      for i in range(args.records)])
        prepared = [p for p in (w.prepare(checkpoint) for w in writers) if p is not None]
        pools_now = {str(w.pool.subtask): w.pool.to_json() for w in writers}
        committer.commit(Decision(checkpoint, prepared, {"attempt": attempt, "pools": pools_now}))
        for writer in writers:
            writer.release(prepared)
        print(json.dumps({"event": "checkpoint", "c": checkpoint}), flush=True)
    print(json.dumps({"event": "finished", "attempt": attempt}), flush=True)
    client.close()


if __name__ == "__main__":
    main()
