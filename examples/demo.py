"""The kafka2pc demo: the main job (``examples/spark_job.py``: Kafka source -> transformation -> kafka2pc sink) on a
local Apache Kafka broker, SIGKILLed mid-stream and restarted from its checkpoint, then ``kafka2pc audit`` of what a
read_committed consumer sees: every order exactly once.

Run with ``make demo`` (which sets up everything first), or ``python examples/demo.py [--bootstrap HOST:PORT]``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import threading
from pathlib import Path

from kafka2pc.cli import main as kafka2pc_cli
from kafka2pc.testing import BrokerSettings, start_kafka
from kafka2pc.testing.verify import create_topic, produce_orders
from kafka2pc_harness.spark import run_driver

JOB = Path(__file__).with_name("spark_job.py")
FIRST_ORDERS, LATER_ORDERS = 3000, 1000


def echo(line: str) -> None:
    print(f"  job | {line}", flush=True)


def run_demo(bootstrap: str, workdir: Path) -> int:
    source, sink = create_topic(bootstrap, partitions=3), create_topic(bootstrap, partitions=3)
    checkpoint = workdir / "checkpoint"
    produce_orders(bootstrap, source, 0, FIRST_ORDERS)
    print(f"{FIRST_ORDERS} orders in {source}; the job writes them, enriched, to {sink} through kafka2pc")
    job = ["--bootstrap", bootstrap, "--source", source, "--sink", sink, "--checkpoint", str(checkpoint),
           "--batch-size", "300", "--trigger-seconds", "0.5"]

    print("\n$ python examples/spark_job.py ...   (Spark local[2]; killed with SIGKILL after its 3rd batch)")
    first = run_driver(JOB, job, log_dir=workdir / "run-1")
    feeder = threading.Thread(target=produce_orders, args=(bootstrap, source, FIRST_ORDERS, LATER_ORDERS),
                              kwargs={"over_s": 5.0})
    try:
        first.wait_for_line(r"^batch 0:", 300, echo=echo)
        feeder.start()  # more orders arrive while it runs
        first.wait_for_line(r"^batch 2:", 120, echo=echo)
    finally:
        killed = first.kill_group()
        if feeder.is_alive():
            feeder.join(timeout=60)
    print(f"SIGKILL: the driver's process group ({len(killed)} processes: driver, JVM, Python workers) is gone\n")

    print(f"$ kafka2pc audit --bootstrap {bootstrap} --topic {sink} --id-field id   (before the restart)")
    kafka2pc_cli(["audit", "--bootstrap", bootstrap, "--topic", sink, "--id-field", "id", "--settle", "1"])

    print("\n$ python examples/spark_job.py ... --until-caught-up   (the same checkpoint)")
    again = run_driver(JOB, [*job, "--until-caught-up"], log_dir=workdir / "run-2")
    try:
        again.wait_for_line(r"^caught up", 600, echo=echo)
        code = again.wait(120)
    finally:
        if again.returncode is None:
            again.kill_group()
    if code != 0:
        print(again.output_tail(), file=sys.stderr)
        return code

    orders = FIRST_ORDERS + LATER_ORDERS
    print(f"\n$ kafka2pc audit --bootstrap {bootstrap} --topic {sink} --id-field id --expect-range 0:{orders - 1}")
    return kafka2pc_cli(["audit", "--bootstrap", bootstrap, "--topic", sink, "--id-field", "id",
                         "--expect-range", f"0:{orders - 1}"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", help="use this cluster instead of starting a local broker")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kafka").setLevel(logging.CRITICAL)  # its readiness-poll connection errors are expected

    with tempfile.TemporaryDirectory(prefix="kafka2pc-demo-") as workdir:
        if args.bootstrap:
            return run_demo(args.bootstrap, Path(workdir))
        print("starting a local Apache Kafka broker (KRaft, 2PC enabled)...", flush=True)
        service = start_kafka(BrokerSettings(), nodes=1)
        try:
            print(f"broker {service.settings.version} ready at {service.bootstrap_servers} ({service.backend})")
            return run_demo(service.bootstrap_servers, Path(workdir))
        finally:
            service.close()


if __name__ == "__main__":
    sys.exit(main())
