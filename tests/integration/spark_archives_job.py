"""A batch write to kafka2pc on a standalone cluster whose executors run the Python named on the command line
(``./environment/bin/python`` from a packed environment shipped with ``spark.archives``, or a bare one). After the
write, prints ``task python=<sys.executable> kafka2pc=<where it was imported from>`` for each task, then
``written`` — or ``failed: <error>`` when the write fails.

    python spark_archives_job.py CONF_JSON BOOTSTRAP TOPIC CHECKPOINT
"""

from __future__ import annotations

import json
import sys


def where(_: object) -> str:
    """Run in a task: the task's interpreter and where kafka2pc comes from."""
    import kafka2pc  # noqa: PLC0415 - executors: the shipped environment's

    return f"task python={sys.executable} kafka2pc={kafka2pc.__file__}"


def main() -> int:
    """Write 200 rows in 2 partitions; report where the tasks' kafka2pc came from."""
    conf, bootstrap, topic, checkpoint = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    from pyspark.sql import SparkSession  # noqa: PLC0415

    builder = SparkSession.builder.appName("kafka2pc-archives")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:
        (spark.range(0, 200, numPartitions=2).selectExpr("to_json(named_struct('id', id)) AS value")
         .write.format("kafka2pc").mode("append").option("kafka.bootstrap.servers", bootstrap)
         .option("topic", topic).option("checkpointLocation", checkpoint).save())
        for line in sorted(set(spark.sparkContext.parallelize(range(2), 2).map(where).collect())):
            print(line, flush=True)
    except Exception as exc:
        print(f"failed: {exc}", flush=True)
        return 1
    finally:
        spark.stop()
    print("written", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
