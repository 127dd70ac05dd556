"""kafka2pc's main job: a PySpark Structured Streaming pipeline from a Kafka topic, through a transformation, to
Kafka through the exactly-once ``kafka2pc`` sink.

Each input record is JSON ``{"id": n, ...}``; each output record keeps the id and adds what the pipeline computed
(the square of the id, and where the input came from), keyed by the id:

    python examples/spark_job.py --bootstrap HOST:PORT --source orders --sink enriched --checkpoint /tmp/ck

Run it, kill it (``kill -9`` of its process group) at any moment, run it again with the same checkpoint: every input
record is in the sink topic exactly once for a read_committed consumer (``kafka2pc audit`` checks it). With
``--until-caught-up`` it processes what the source holds and exits (Spark's availableNow trigger); otherwise it runs
until stopped. ``make demo`` runs it on a local broker, kills it once mid-way and audits the result.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def build_query(spark: object, args: argparse.Namespace) -> object:
    """The pipeline: Kafka source -> transformation -> kafka2pc sink."""
    from pyspark.sql import functions as F  # noqa: PLC0415 - pyspark's convention; imported once Spark runs

    source = (spark.readStream.format("kafka")  # type: ignore[attr-defined]
              .option("kafka.bootstrap.servers", args.bootstrap).option("subscribe", args.source)
              .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", args.batch_size).load())
    order = F.from_json(F.col("value").cast("string"), "id BIGINT, amount DOUBLE")
    enriched = (source.select(order.alias("order"), "partition", "offset")
                .select(F.col("order.id").alias("id"),
                        (F.col("order.id") * F.col("order.id")).alias("id_squared"),
                        F.coalesce(F.col("order.amount"), F.lit(0.0)).alias("amount"),
                        F.col("partition").alias("source_partition"), F.col("offset").alias("source_offset")))
    sink = (enriched.select(F.col("id").cast("string").alias("key"), F.to_json(F.struct("*")).alias("value"))
            .writeStream.format("kafka2pc")
            .option("kafka.bootstrap.servers", args.bootstrap).option("topic", args.sink)
            .option("checkpointLocation", args.checkpoint))
    if args.until_caught_up:
        return sink.trigger(availableNow=True).start()
    return sink.trigger(processingTime=f"{args.trigger_seconds} seconds").start()


def main(argv: list[str] | None = None) -> int:
    """Run the job; with --until-caught-up, until the source is consumed."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers (source and sink)")
    parser.add_argument("--source", required=True, help="the input topic")
    parser.add_argument("--sink", required=True, help="the output topic")
    parser.add_argument("--checkpoint", required=True, help="the query's checkpoint location (a local path)")
    parser.add_argument("--batch-size", type=int, default=500, help="input records per micro-batch at most")
    parser.add_argument("--trigger-seconds", type=float, default=1.0)
    parser.add_argument("--until-caught-up", action="store_true", help="stop once the source is consumed")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession  # noqa: PLC0415 - after PYSPARK_PYTHON is set

    from kafka2pc_harness.spark import spark_kafka_jars  # noqa: PLC0415 - Spark's Kafka source, from Maven Central

    spark = (SparkSession.builder.master(args.master).appName("kafka2pc-spark-job")
             .config("spark.jars", ",".join(spark_kafka_jars())).config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    query = build_query(spark, args)
    print(f"started query {query.id} (checkpoint {args.checkpoint})", flush=True)  # type: ignore[attr-defined]
    last = -1
    while query.isActive:  # type: ignore[attr-defined]
        progress = query.lastProgress  # type: ignore[attr-defined]
        if progress is not None and progress["batchId"] != last:
            last = progress["batchId"]
            print(f"batch {last}: {progress['numInputRows']} rows", flush=True)
        time.sleep(0.2)
    error = query.exception()  # type: ignore[attr-defined]
    if error is not None:
        print(f"query failed: {error}", file=sys.stderr, flush=True)
        return 1
    print("caught up", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
