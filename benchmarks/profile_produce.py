"""Where the producer's CPU goes: ``--transactions`` transactions of 10 000 100-byte records through a
TwoPhaseProducer (two-phase commit) on a broker (a local 4.4.0 one, or --bootstrap), written one by one
(``produce``) or at once (``produce_batch``), after one warm-up transaction; the process's CPU (user + system, every
thread) per record. With ``--py-spy FILE``, py-spy samples the GIL-held time of the counted transactions (as
profile_dual_write.py does) and the top frames are printed.

    python benchmarks/profile_produce.py [--api produce|produce_batch] [--transactions 40] [--py-spy stacks.txt]
                                         [--top 20] [--bootstrap HOST:PORT]
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from pathlib import Path

from profile_dual_write import sampled, summarize  # benchmarks/ is the script's folder: on sys.path

from kafka2pc import TwoPhaseProducer
from kafka2pc.testing.provider import bootstrap_or_local
from kafka2pc.testing.verify import create_topic

RECORDS_PER_TXN = 10_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api", choices=("produce", "produce_batch"), default="produce")
    parser.add_argument("--transactions", type=int, default=40)
    parser.add_argument("--py-spy", type=Path, dest="py_spy")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--bootstrap")
    args = parser.parse_args()
    values = [os.urandom(100) for _ in range(RECORDS_PER_TXN)]
    with bootstrap_or_local(args.bootstrap) as bootstrap:
        topic = create_topic(bootstrap, partitions=3)
        config = {"bootstrap.servers": bootstrap, "transactional.id": f"prof{uuid.uuid4().hex[:6]}"}
        with TwoPhaseProducer(config, two_phase_commit=True) as producer:
            producer.init_transactions()

            def transaction() -> None:
                producer.begin_transaction()
                if args.api == "produce":
                    for value in values:
                        producer.produce(topic, value)
                else:
                    producer.produce_batch(topic, values)
                producer.complete_transaction(producer.prepare_transaction())

            transaction()  # warm-up: metadata, the first batch's buffers
            with sampled(args.py_spy):
                began, before = time.monotonic(), os.times()
                for _ in range(args.transactions):
                    transaction()
                wall, after = time.monotonic() - began, os.times()
    records = args.transactions * RECORDS_PER_TXN
    cpu_us = 1e6 * ((after.user - before.user) + (after.system - before.system)) / records
    print(f"{args.api}: {records:,} records in {args.transactions} transactions: {records / wall:,.0f} records/s; CPU "
          f"{cpu_us:.2f} us per record{' (py-spy sampling)' if args.py_spy else ''}")
    if args.py_spy:
        print(summarize(args.py_spy, args.top, caller="main.<locals>.transaction ("))


if __name__ == "__main__":
    main()
