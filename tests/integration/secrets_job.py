"""Every kafka2pc surface run once at DEBUG against secured listeners, for test_secrets.py to search what it prints.

    python secrets_job.py PLAN.json [--leak]

PLAN holds the configurations (with their secrets) and topics. Logging goes to stderr at DEBUG for every logger
(kafka-python's included); Spark's Python workers log at DEBUG too (KAFKA2PC_LOG_LEVEL). ``--leak`` turns kafka2pc's
log scrubbing off, so the test can show that its search finds a secret that is logged."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import sys
import tempfile
from pathlib import Path


def main() -> int:
    plan = json.loads(Path(sys.argv[1]).read_text())
    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    if "--leak" in sys.argv:
        from kafka2pc.config import redaction  # noqa: PLC0415

        redaction._scrub = lambda record: None
    from kafka2pc import Kafka2pcError, TransactionControl, TwoPhaseProducer  # noqa: PLC0415
    from kafka2pc.cluster import ClusterClient  # noqa: PLC0415
    from kafka2pc.config import ClientConfig  # noqa: PLC0415
    from kafka2pc.dualwrite import DualWriter  # noqa: PLC0415

    topic = plan["topic"]
    for name, config in plan["producers"].items():
        producer = TwoPhaseProducer({**config, "transactional.id": f"secrets-{name}"}, two_phase_commit=True)
        print(f"{name}: {producer!r} {ClientConfig.from_dict(config, consumed_elsewhere={'max.block.ms'})!r}")
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(topic, value=name.encode())
        producer.complete_transaction(producer.prepare_transaction())
        producer.close()
    for name, config in plan["refused"].items():
        try:
            TwoPhaseProducer({**config, "transactional.id": "secrets-refused"}, two_phase_commit=True) \
                .init_transactions()
        except Kafka2pcError as exc:
            print(f"{name}: {type(exc).__name__}: {exc} {exc!r}")
            logging.getLogger("secrets_job").exception("refused as expected")
    with tempfile.TemporaryDirectory() as directory:
        connection = sqlite3.connect(Path(directory) / "app.db")
        connection.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
        writer = DualWriter(connection, {**plan["java"], "transactional.id": "secrets-dual"})
        print(f"dual writer: {writer!r}")
        with writer.transaction() as tx:
            tx.cursor.execute("INSERT INTO orders (id) VALUES (1)")
            tx.produce(topic, value=b"dual")
        writer.close()
        connection.close()
    with ClusterClient(ClientConfig.from_dict(plan["java"])) as client:
        print(f"listing: {len(TransactionControl(client).list())} transactions")
    spark_write(plan)
    return 0


def spark_write(plan: dict) -> None:
    os.environ["KAFKA2PC_LOG_LEVEL"] = "DEBUG"
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession  # noqa: PLC0415

    spark = (SparkSession.builder.master("local[1]").appName("kafka2pc-secrets")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
    options = {f"kafka.{key}": value for key, value in plan["java"].items()}
    with tempfile.TemporaryDirectory() as directory:
        spark.range(0, 10, numPartitions=2).selectExpr("CAST(id AS STRING) AS value").write.format("kafka2pc") \
            .options(**options).option("topic", plan["topic"]).option("checkpointLocation", directory) \
            .mode("append").save()
    print("spark: written")
    spark.stop()


if __name__ == "__main__":
    raise SystemExit(main())
