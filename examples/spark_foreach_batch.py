"""A PySpark Structured Streaming job that writes to Kafka from ``foreachBatch``, exactly once.

Spark replays a micro-batch whose ``foreachBatch`` function returned but whose end Spark had not yet recorded (the
driver died in between). A plain batch write inside ``foreachBatch`` would then be written twice; with ``txnAppId``
(a stable id of this application) and ``txnVersion`` (the micro-batch id) the replay writes nothing:

    python examples/spark_foreach_batch.py --bootstrap HOST:PORT --source orders --sink enriched \\
        --checkpoint /tmp/ck

The query's own checkpoint is ``--checkpoint``; the kafka2pc writes keep their decisions in ``<checkpoint>-kafka2pc``
(one location per write inside the function). Kill it (``kill -9`` of its process group) at any moment and run it
again: every input record is in the sink topic exactly once for a read_committed consumer.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any


def batch_writer(args: argparse.Namespace) -> Callable[[Any, int], None]:
    """The function foreachBatch calls: one keyed kafka2pc batch write per micro-batch."""
    from pyspark.sql import functions as F  # noqa: PLC0415 - pyspark's convention; imported once Spark runs

    def write(batch: Any, batch_id: int) -> None:
        order = F.from_json(F.col("value").cast("string"), "id BIGINT, amount DOUBLE")
        enriched = (batch.select(order.alias("order"))
                    .select(F.col("order.id").cast("string").alias("key"),
                            F.to_json(F.struct(F.col("order.id").alias("id"),
                                               F.coalesce(F.col("order.amount"), F.lit(0.0)).alias("amount")))
                            .alias("value")))
        writer = (enriched.write.format("kafka2pc").mode("append")
                  .option("kafka.bootstrap.servers", args.bootstrap).option("topic", args.sink)
                  .option("checkpointLocation", f"{args.checkpoint}-kafka2pc"))
        if not args.unkeyed:
            writer = writer.option("txnAppId", args.app_id).option("txnVersion", batch_id)
        writer.save()

    return write


def build_query(spark: Any, args: argparse.Namespace, write: Callable[[Any, int], None]) -> Any:
    """Kafka source -> foreachBatch(write)."""
    source = (spark.readStream.format("kafka")
              .option("kafka.bootstrap.servers", args.bootstrap).option("subscribe", args.source)
              .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", args.batch_size).load())
    stream = source.writeStream.foreachBatch(write).option("checkpointLocation", args.checkpoint)
    if args.until_caught_up:
        return stream.trigger(availableNow=True).start()
    return stream.trigger(processingTime=f"{args.trigger_seconds} seconds").start()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The job's arguments."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers (source and sink)")
    parser.add_argument("--source", required=True, help="the input topic")
    parser.add_argument("--sink", required=True, help="the output topic")
    parser.add_argument("--checkpoint", required=True, help="the query's checkpoint location (a local path)")
    parser.add_argument("--app-id", default="kafka2pc-foreach-batch-example", help="txnAppId: stable per application")
    parser.add_argument("--unkeyed", action="store_true",
                        help="leave txnAppId/txnVersion out (a replayed batch is then written twice)")
    parser.add_argument("--batch-size", type=int, default=500, help="input records per micro-batch at most")
    parser.add_argument("--trigger-seconds", type=float, default=1.0)
    parser.add_argument("--until-caught-up", action="store_true", help="stop once the source is consumed")
    parser.add_argument("--master", default="local[2]")
    return parser.parse_args(argv)


def run(args: argparse.Namespace, write: Callable[[Any, int], None] | None = None) -> int:
    """Run the query until it stops (with --until-caught-up, once the source is consumed)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession  # noqa: PLC0415 - after PYSPARK_PYTHON is set

    from kafka2pc_harness.spark import spark_kafka_jars  # noqa: PLC0415 - Spark's Kafka source, from Maven Central

    spark = (SparkSession.builder.master(args.master).appName("kafka2pc-foreach-batch")
             .config("spark.jars", ",".join(spark_kafka_jars())).config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    query = build_query(spark, args, write or batch_writer(args))
    print(f"started query {query.id} (checkpoint {args.checkpoint})", flush=True)
    while query.isActive:
        time.sleep(0.2)
    error = query.exception()
    if error is not None:
        print(f"query failed: {error}", file=sys.stderr, flush=True)
        return 1
    print("caught up", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(run(parse()))
