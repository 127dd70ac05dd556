"""The kafka2pc demo: start a local Apache Kafka, prepare and complete a two-phase transaction, abort another,
read back what a read_committed consumer sees, and print what `kafka2pc doctor` says of the broker.

Run with `make demo` (which sets up everything first), or `python examples/demo.py [--bootstrap HOST:PORT]`.
"""

from __future__ import annotations

import argparse
import logging
import sys

from kafka2pc import TwoPhaseProducer
from kafka2pc.cli import main as kafka2pc_cli
from kafka2pc.testing import BrokerSettings, start_kafka
from kafka2pc.testing.verify import create_topic, read_records


def run_transactions(bootstrap: str) -> None:
    topic = create_topic(bootstrap)
    with TwoPhaseProducer({"bootstrap.servers": bootstrap, "transactional.id": "kafka2pc-demo"},
                          two_phase_commit=True) as producer:
        producer.init_transactions()
        print(f"two-phase commit active: {producer.two_phase_commit_active}")

        producer.begin_transaction()
        for i in range(5):
            producer.produce(topic, key=f"order-{i}".encode(), value=f"committed {i}".encode())
        state = producer.prepare_transaction()
        print(f"prepared a transaction of 5 records to {topic}: state {str(state)!r} (store it with the decision)")
        print(f"complete_transaction({str(state)!r}) -> {producer.complete_transaction(state).value}")

        producer.begin_transaction()
        for i in range(3):
            producer.produce(topic, key=f"order-x{i}".encode(), value=f"aborted {i}".encode())
        producer.flush()
        producer.abort_transaction()
        print(f"aborted a transaction of 3 records to {topic}")

    seen = read_records(bootstrap, topic)
    print(f"a read_committed consumer sees {len(seen)} records:")
    for record in seen:
        print(f"  offset {record.offset}: {record.key!r} -> {record.value!r}")
    if [r.value for r in seen] != [f"committed {i}".encode() for i in range(5)]:
        raise SystemExit("unexpected records: the demo's transactions did not behave as Kafka's should")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", help="use this cluster instead of starting a local broker")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kafka").setLevel(logging.CRITICAL)  # its readiness-poll connection errors are expected

    if args.bootstrap:
        run_transactions(args.bootstrap)
        return kafka2pc_cli(["doctor", "--bootstrap", args.bootstrap])

    print("starting a local Apache Kafka broker (KRaft, 2PC enabled)...", flush=True)
    service = start_kafka(BrokerSettings(), nodes=1)
    try:
        print(f"broker {service.settings.version} ready at {service.bootstrap_servers} ({service.backend})")
        run_transactions(service.bootstrap_servers)
        print("\n$ kafka2pc doctor --bootstrap", service.bootstrap_servers)
        return kafka2pc_cli(["doctor", "--bootstrap", service.bootstrap_servers])
    finally:
        service.close()


if __name__ == "__main__":
    sys.exit(main())
