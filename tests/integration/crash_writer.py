"""A writer process the crash tests SIGKILL: it writes a transaction, optionally prepares it, prints its state as
one JSON line, then waits (at most ``--linger`` seconds) to be killed."""

import argparse
import json
import sys
import time
from pathlib import Path

from kafka2pc import TwoPhaseProducer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--transactional-id", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--stage", choices=["before-prepare", "after-prepare"], required=True)
    parser.add_argument("--two-phase-commit", action="store_true")
    parser.add_argument("--linger", type=float, default=120.0)
    parser.add_argument("--config", help="a JSON file of further client settings (a secured cluster's)")
    args = parser.parse_args()

    extra = json.loads(Path(args.config).read_text()) if args.config else {}
    producer = TwoPhaseProducer({**extra, "bootstrap.servers": args.bootstrap,
                                 "transactional.id": args.transactional_id}, two_phase_commit=args.two_phase_commit)
    producer.init_transactions()
    producer.begin_transaction()
    producer.produce_batch(args.topic, [f"crash-{i}".encode() for i in range(args.count)])
    if args.stage == "after-prepare":
        state = str(producer.prepare_transaction())
    else:
        producer.flush()  # on the broker, but not prepared: the writer "crashes" mid-transaction
        state = None
    print(json.dumps({"state": state, "producer": list(producer.producer_id_and_epoch)}), flush=True)
    time.sleep(args.linger)  # bounded: the test kills us long before this ends
    sys.exit(3)


if __name__ == "__main__":
    main()
