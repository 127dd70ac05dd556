"""A batch write for the kill tests: ids ``first .. first + count - 1`` as JSON, in 8 partitions, into kafka2pc.

    python spark_batch_job.py BOOTSTRAP TOPIC CHECKPOINT FIRST COUNT [STRAGGLE_S]

With STRAGGLE_S, partition 0 stalls that long after handing its first rows to the sink, so a test can kill the driver
while the tasks write (before any decision)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator


def main() -> int:
    bootstrap, topic, checkpoint, first, count = sys.argv[1], sys.argv[2], sys.argv[3], *map(int, sys.argv[4:6])
    straggle_s = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark import TaskContext  # noqa: PLC0415
    from pyspark.sql import SparkSession  # noqa: PLC0415

    def stall(batches: Iterator[object]) -> Iterator[object]:
        context = TaskContext.get()
        for index, batch in enumerate(batches):
            yield batch
            if index == 0 and context is not None and context.partitionId() == 0:
                time.sleep(straggle_s)

    spark = (SparkSession.builder.master("local[2]").appName("kafka2pc-batch-job")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.execution.arrow.maxRecordsPerBatch", "50").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    rows = spark.range(first, first + count, numPartitions=8).selectExpr(
        "CAST(id AS STRING) AS key", "to_json(named_struct('id', id)) AS value")
    if straggle_s:
        rows = rows.mapInArrow(stall, rows.schema)
    print("writing", flush=True)
    (rows.write.format("kafka2pc").mode("append").option("kafka.bootstrap.servers", bootstrap)
     .option("topic", topic).option("checkpointLocation", checkpoint).save())
    print("written", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
