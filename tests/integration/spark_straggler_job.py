"""A streaming job for the standalone-cluster test: Kafka source -> a step that makes stragglers -> kafka2pc sink.

The first attempt of every task of the source's partition 0 sleeps after handing its first rows to the sink (its
transaction is open on the broker), so Spark's speculation launches a copy on the other executor, which wins; the
loser is killed or prepares late. Runs with Spark's availableNow trigger: it exits once the source is consumed.

    python spark_straggler_job.py MASTER_URL CONF_JSON BOOTSTRAP SOURCE SINK CHECKPOINT MARKERS

When a straggler starts to sleep it touches a file named after its Python worker's pid in the folder MARKERS, so a
test can kill the executor that runs it (a straggler that loses to its speculative copy is killed mid-sleep: markers
older than STRAGGLE_S are stale).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

STRAGGLE_S = 4.0
SPECULATION = {
    "spark.speculation": "true",
    "spark.speculation.interval": "100ms",
    "spark.speculation.quantile": "0.5",
    "spark.speculation.multiplier": "1.5",
    "spark.speculation.minTaskRuntime": "500ms",
    # a straggler here reads its input at full speed and then stalls: judge it by its run time alone
    "spark.speculation.efficiency.enabled": "false",
    # the Kafka source prefers the executor that cached a partition's consumer: do not wait for it
    "spark.locality.wait": "0s",
    "spark.task.maxFailures": "8",
    # small Arrow batches and a small buffer between Python workers (with 2 KB rows), so a straggler's rows reach
    # the sink (its transaction is open on the broker) before it sleeps
    "spark.sql.execution.arrow.maxRecordsPerBatch": "20",
    "spark.buffer.size": "1024",
}


def straggler(markers: str) -> Callable[[Iterator[object]], Iterator[object]]:
    """Pass rows through; the first attempt of partition 0 stalls after its first Arrow batches."""

    def straggle(batches: Iterator[object]) -> Iterator[object]:
        from pyspark import TaskContext  # noqa: PLC0415 - executors only

        context = TaskContext.get()
        slow = context is not None and context.partitionId() == 0 and context.attemptNumber() == 0
        for index, batch in enumerate(batches):
            yield batch
            if slow and index < 2:
                time.sleep(0.05)  # the sink gets these apart by more than linger.ms: it sends, its transaction opens
            elif slow and index == 2:
                (Path(markers) / str(os.getpid())).touch()
                time.sleep(STRAGGLE_S)

    return straggle


def main() -> int:
    master, conf, bootstrap, source, sink, checkpoint, markers = sys.argv[1:8]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession  # noqa: PLC0415

    from kafka2pc_harness.spark import spark_kafka_jars  # noqa: PLC0415

    builder = SparkSession.builder.master(master).appName("kafka2pc-straggler-job")
    for key, value in {**json.loads(conf), **SPECULATION}.items():
        builder = builder.config(key, value)
    spark = (builder.config("spark.jars", ",".join(spark_kafka_jars())).config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    print(f"app_id={spark.sparkContext.applicationId}", flush=True)
    rows = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", source)
            .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", 400).load()
            .selectExpr("CAST(key AS STRING) AS key",
                        "to_json(named_struct('id', CAST(get_json_object(CAST(value AS STRING), '$.id') AS BIGINT), "
                        "'pad', repeat('x', 2000))) AS value"))
    query = (rows.mapInArrow(straggler(markers), rows.schema).writeStream.format("kafka2pc")
             .option("kafka.bootstrap.servers", bootstrap).option("topic", sink)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    last = -1
    while query.isActive:
        progress = query.lastProgress
        if progress is not None and progress["batchId"] != last:
            last = progress["batchId"]
            print(f"batch {last}: {progress['numInputRows']} rows", flush=True)
        time.sleep(0.2)
    if query.exception() is not None:
        print(f"query failed: {query.exception()}", file=sys.stderr, flush=True)
        return 1
    print("caught up", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
