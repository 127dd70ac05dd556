"""Keyed batch writes one after another, for the rolling-restart test: write ``k`` is the ids ``k * ROWS .. (k + 1) *
ROWS - 1`` as JSON in 4 partitions, into kafka2pc with ``txnAppId`` ``rolling`` and ``txnVersion`` ``k``, until STOP
exists (checked before each new write).

    python spark_batch_rolling_job.py BOOTSTRAP TOPIC CHECKPOINT ROWS STOP

A write that fails is run again with the same version (a keyed write can simply be run again: a decided version
writes nothing), after 1 s, up to 30 times. Prints ``written <k> <time.time()>`` per write done and ``failed <k>
attempt <n>: <kafka2pc errors named, comma-separated, or 'unnamed'> <its first line>`` per failure; exits 0 once
STOP is seen, 2 when a version failed 30 times."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import kafka2pc.errors

NAMES = sorted((name for name, value in vars(kafka2pc.errors).items()
                if isinstance(value, type) and issubclass(value, kafka2pc.errors.Kafka2pcError)),
               key=len, reverse=True)
NAMED = re.compile(r"\b(" + "|".join(NAMES) + r")\b")


def main() -> int:
    bootstrap, topic, checkpoint, rows, stop = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession  # noqa: PLC0415

    spark = (SparkSession.builder.master("local[2]").appName("kafka2pc-batch-rolling")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    version = 0
    while not Path(stop).exists():  # the test creates STOP once its cluster events are over
        first = version * rows
        frame = spark.range(first, first + rows, numPartitions=4).selectExpr(
            "CAST(id AS STRING) AS key", "to_json(named_struct('id', id)) AS value")
        for attempt in range(1, 31):
            try:
                (frame.write.format("kafka2pc").mode("append").option("kafka.bootstrap.servers", bootstrap)
                 .option("topic", topic).option("checkpointLocation", checkpoint)
                 .option("txnAppId", "rolling").option("txnVersion", str(version)).save())
            except Exception as exc:  # reported, and the same version run again
                said = str(exc)
                names = ",".join(sorted(set(NAMED.findall(said)))) or "unnamed"
                first_line = said.strip().splitlines()[0][:300] if said.strip() else type(exc).__name__
                print(f"failed {version} attempt {attempt}: {names} {first_line}", flush=True)
                print(f"--- write {version} attempt {attempt} ---\n{said[-4000:]}", file=sys.stderr, flush=True)
                time.sleep(1)
                continue
            print(f"written {version} {time.time():.3f}", flush=True)
            break
        else:
            return 2
        version += 1
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
