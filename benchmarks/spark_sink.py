"""The kafka2pc Spark sink against Spark's own Kafka sink, in one run, on one broker, Spark local[2]:

1. throughput: the same cached DataFrame (``--rows`` rows in 8 partitions, ~100-byte JSON values, string keys) written
   by ``df.write.format("kafka")`` (Spark's sink, at-least-once), ``df.write.format("kafka2pc")`` (exactly-once) and
   a Python Arrow sink that writes nowhere (``noop_arrow``: what any pyspark Python sink costs at least),
   ``--rounds`` times each, interleaved; median rows/s and the ratios; and the fixed cost of a write: the same three
   writing an 8-row DataFrame (one row per partition), median ms. Beside each, the CPU it took (user + system of
   this process, Spark's JVM and its Python workers: CPU us per row, CPU ms per 8-row write);
2. the driver's two-phase-commit time per micro-batch at 8 partitions: a streaming query (rate-micro-batch, 8
   partitions) into kafka2pc for ``--batches`` batches, its driver logging each commit (``KAFKA2PC_LOG_LEVEL=INFO``):
   the check that the 8 offered transactions are still open (DescribeTransactions), the decision record, the
   completions (EndTxn of 8 transactions, then the done mark), and the cleanup listing that follows; p50/p99;
3. the same Committer.settle of 8 prepared transactions from a plain Python process while Spark is stopped: what the
   driver's 2PC costs on this broker without Spark's processes competing for the CPUs (the peer of 2).

4. the restart to the first completed batch, after a stop and after a SIGKILL, against a Python sink without 2PC.

``--python-worker-reuse false`` runs all of it with ``spark.python.worker.reuse=false`` (a Python worker per task:
no producer outlives its task); ``--restart-rounds 0`` leaves part 4 out.

    python benchmarks/spark_sink.py [--bootstrap HOST:PORT] [--rows 400000] [--rounds 3] [--batches 40]
                                    [--restart-rounds 3] [--python-worker-reuse true|false]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kafka2pc.testing.provider import bootstrap_or_local
from kafka2pc.testing.verify import create_topic, end_offsets
from kafka2pc_harness.spark import run_driver

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PARTITIONS = 8
REUSE_ENV = "KAFKA2PC_BENCH_PYTHON_WORKER_REUSE"  # the drivers run in subprocesses: main passes the flag this way
COMMIT_LINE = re.compile(r"batch (\d+): committed (\d+) transaction\(s\); check ([\d.]+) ms, record ([\d.]+) ms, "
                         r"complete ([\d.]+) ms, cleanup ([\d.]+) ms(?:; (\d+) of (\d+) task)?")


def throughput(bootstrap: str, rows: int, rounds: int, workdir: Path, *, fixed: dict[str, list[float]],
               cpu: dict[str, list[float]], fixed_cpu: dict[str, list[float]]) -> dict[str, list[float]]:
    """rows/s of each sink, per round; ``fixed`` gets the ms of each sink's 8-row writes; ``cpu`` the CPU us per row
    of each round's write, ``fixed_cpu`` the CPU ms of each 8-row write."""
    from pyspark.sql import functions as F  # noqa: PLC0415

    from kafka2pc_harness.noop_sink import NoopArrowSink  # noqa: PLC0415
    from kafka2pc_harness.spark import local_session, stop_session  # noqa: PLC0415

    spark = local_session("kafka2pc-bench", cores=2, kafka_connector=True,
                          conf={"spark.python.worker.reuse": worker_reuse()})
    try:
        df = (spark.range(rows, numPartitions=PARTITIONS)
              .select(F.col("id").cast("string").alias("key"),
                      F.to_json(F.struct(F.col("id"), F.lit("x" * 70).alias("pad"))).alias("value"))
              .cache())
        df.count()
        spark.dataSource.register(NoopArrowSink)
        tiny = spark.range(PARTITIONS, numPartitions=PARTITIONS).select(
            F.col("id").cast("string").alias("key"), F.to_json(F.struct(F.col("id"))).alias("value")).cache()
        tiny.count()
        results: dict[str, list[float]] = {name: [] for name in SINKS}
        for round_number in range(-1, rounds):  # round 0: warm-up (JVM, Python workers, connections), not counted
            for name, rates in results.items():
                # one checkpoint location for every write of a sink, as a job that appends again and again has (the
                # ids of a location come back: its Python workers' cached producers can go on)
                elapsed, cpu_s = timed_write(df, name, bootstrap, workdir / "ck-throughput", rows)
                if round_number >= 0:
                    rates.append(rows / elapsed)
                    cpu[name].append(1e6 * cpu_s / rows)
                label = f"round {round_number + 1}" if round_number >= 0 else "warm-up"
                print(f"  {label}: {name:34s} {rows / elapsed:>10,.0f} rows/s  CPU {1e6 * cpu_s / rows:6.2f} us/row",
                      flush=True)
        for _ in range(FIXED_COST_WRITES):
            for name in SINKS:
                elapsed, cpu_s = timed_write(tiny, name, bootstrap, workdir / "ck-tiny", PARTITIONS)
                fixed[name].append(1000 * elapsed)
                fixed_cpu[name].append(1000 * cpu_s)
        return results
    finally:
        stop_session(spark)


SINKS = ("spark kafka sink (at-least-once)", "kafka2pc (exactly-once)", "noop_arrow (Python sink floor)")
FIXED_COST_WRITES = 7


def spark_cpu_s() -> float:
    """CPU seconds so far (user + system) of this process's own threads and of Spark's JVM with every process below
    it (pyspark's daemon and Python workers; exited ones through their parent's reaped-children times), from /proc.
    The broker, also a child of this process when the benchmark starts it, is not counted."""
    from pyspark import SparkContext  # noqa: PLC0415

    from kafka2pc_harness.spark_cluster import descendants, process_table  # noqa: PLC0415

    own = os.times()
    proc = getattr(SparkContext._gateway, "proc", None)  # pyspark keeps the JVM's Popen only there
    if proc is None:
        return own.user + own.system
    table = process_table()
    return own.user + own.system + sum(table[pid].cpu_s for pid in (proc.pid, *descendants(proc.pid, table))
                                       if pid in table)


def timed_write(df: Any, name: str, bootstrap: str, checkpoint: Path, rows: int) -> tuple[float, float]:
    """Seconds ``df.write`` takes into a fresh topic with sink ``name`` (all its rows written, checked), and the CPU
    seconds it took (:func:`spark_cpu_s`). A write that
    fails (seen once with Spark's own sink: NOT_LEADER_OR_FOLLOWER, then OUT_OF_ORDER_SEQUENCE_NUMBER on a new
    topic) is reported and run once more on a fresh topic; a second failure ends the benchmark."""
    try:
        return _timed_write(df, name, bootstrap, checkpoint, rows)
    except Exception as exc:
        print(f"  {name} failed ({type(exc).__name__}: {str(exc)[:200]}); running it once more on a fresh topic",
              flush=True)
        return _timed_write(df, name, bootstrap, checkpoint.with_name(checkpoint.name + "-again"), rows)


def _timed_write(df: Any, name: str, bootstrap: str, checkpoint: Path, rows: int) -> tuple[float, float]:
    if name.startswith("noop"):
        started, cpu = time.perf_counter(), spark_cpu_s()
        df.write.mode("append").format("noop_arrow").save()
        return time.perf_counter() - started, spark_cpu_s() - cpu
    topic = create_topic(bootstrap, partitions=PARTITIONS)
    writer = df.write.mode("append").option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
    if name.startswith("kafka2pc"):
        writer = writer.format("kafka2pc").option("checkpointLocation", str(checkpoint))
    else:
        writer = writer.format("kafka")
    started, cpu = time.perf_counter(), spark_cpu_s()
    writer.save()
    elapsed, cpu = time.perf_counter() - started, spark_cpu_s() - cpu
    check_written(name, bootstrap, topic, rows)
    return elapsed, cpu


def check_written(name: str, bootstrap: str, topic: str, rows: int) -> None:
    """End the benchmark when a read_committed consumer cannot see ``rows`` rows in ``topic``, saying which side
    was short: the sink (too few records in the log) or the commit (records there, transactions not committed)."""
    committed = sum(end_offsets(bootstrap, topic, settle_s=30.0).values())
    if committed >= rows:  # end offsets count each commit's markers too: at least ``rows``
        return
    logged = sum(end_offsets(bootstrap, topic, isolation="read_uncommitted").values())
    if logged < rows:
        raise SystemExit(f"{name} wrote {logged} of {rows} rows: the sink is short (log end offsets)")
    raise SystemExit(f"{name}: the log holds {logged} offsets for {rows} rows, but read_committed reads only to "
                     f"{committed} after 30 s: transactions were left open, not committed")


def worker_reuse() -> str:
    """``spark.python.worker.reuse`` for every session of this run (Spark's default: true)."""
    return os.environ.get(REUSE_ENV, "true")


def driver_session(app_name: str) -> SparkSession:
    """The local[2] session of a streaming driver subprocess (no UI, errors only in its log)."""
    from pyspark.sql import SparkSession  # noqa: PLC0415

    spark = (SparkSession.builder.master("local[2]").appName(app_name)
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.python.worker.reuse", worker_reuse()).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def streaming_driver(bootstrap: str, topic: str, checkpoint: str, batches: int, rows_per_batch: int) -> int:
    """Run in a subprocess: a rate-micro-batch query into kafka2pc until ``batches`` batches have committed."""
    spark = driver_session("kafka2pc-bench-commit")
    query = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", rows_per_batch)
             .option("numPartitions", PARTITIONS).load()
             .selectExpr("CAST(value AS STRING) AS key", "to_json(named_struct('id', value)) AS value")
             .writeStream.format("kafka2pc").option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
             .option("checkpointLocation", checkpoint).trigger(processingTime="0 seconds").start())
    while query.isActive and (query.lastProgress is None or query.lastProgress["batchId"] < batches - 1):
        time.sleep(0.1)
    query.stop()
    spark.stop()
    return 0


RESTART_SINKS = ("kafka2pc (exactly-once)", "noop_arrow (Python sink, no 2PC)")
PLANNED_LINE = re.compile(r"planned a batch in ([\d.]+) ms: checkpoint state ([\d.]+) ms, window move ([\d.]+) ms, "
                          r"recovery ([\d.]+) ms")


def restart_driver(sink: str, bootstrap: str, topic: str, checkpoint: str, phase: str) -> int:
    """Run in a subprocess: ``first`` runs a streaming query until 3 micro-batches are done and stops it;
    ``until-killed`` runs it on, saying when 3 are done, until it is SIGKILLed; ``restart`` starts it again on the
    same checkpoint and prints (JSON) the seconds from ``start()`` to its first completed batch and that batch's
    ``durationMs``."""
    from kafka2pc_harness.noop_sink import NoopArrowSink  # noqa: PLC0415

    spark = driver_session("kafka2pc-bench-restart")
    spark.dataSource.register(NoopArrowSink)
    writer = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 8000)
              .option("numPartitions", PARTITIONS).load()
              .selectExpr("CAST(value AS STRING) AS key", "to_json(named_struct('id', value)) AS value")
              .writeStream.option("checkpointLocation", checkpoint).trigger(processingTime="0 seconds"))
    if sink.startswith("kafka2pc"):
        writer = writer.format("kafka2pc").option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
    else:
        writer = writer.format("noop_arrow")
    started = time.perf_counter()
    query = writer.start()
    first: float | None = None
    progress: dict[str, Any] | None = None
    deadline = time.monotonic() + 300
    while query.isActive and time.monotonic() < deadline:  # bounded
        progress = query.lastProgress
        if phase == "restart" and progress is not None:
            first = time.perf_counter() - started
            break
        if phase == "first" and progress is not None and progress["batchId"] >= 2:
            break
        if phase == "until-killed" and progress is not None and progress["batchId"] >= 2:
            print("three batches done: kill me", flush=True)
        time.sleep(0.02)
    query.stop()
    spark.stop()
    print(json.dumps({"first_batch_s": first, "duration_ms": (progress or {}).get("durationMs", {})}))
    return 0 if phase == "first" or first is not None else 1


def restart_times(bootstrap: str, rounds: int, workdir: Path, *, killed: bool) -> dict[str, list[dict[str, Any]]]:
    """Per sink, per round: a query run for 3 batches, stopped (or SIGKILLed with its whole process group, a batch
    in flight), and started again; what its restart reported (plus, for kafka2pc, its planning line)."""
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in RESTART_SINKS}
    for round_number in range(rounds):
        for name in RESTART_SINKS:
            topic = create_topic(bootstrap, partitions=PARTITIONS)
            how = "killed" if killed else "stopped"
            checkpoint = str(workdir / f"restart-{how}-{round_number}-{name.split()[0]}")
            report: dict[str, Any] = {}
            for phase in ("until-killed" if killed else "first", "restart"):
                driver = run_driver(__file__, ["--restart-driver", name, bootstrap, topic, checkpoint, phase],
                                    env={"KAFKA2PC_LOG_LEVEL": "INFO", "PYSPARK_PYTHON": sys.executable},
                                    log_dir=workdir / f"restart-{how}-{round_number}-{phase}-{name.split()[0]}")
                if phase == "until-killed":
                    driver.wait_for_line("kill me", 300)
                    driver.kill_group()
                    continue
                if driver.wait(600) != 0:
                    raise SystemExit(f"the {phase} run of {name} failed:\n{driver.output_tail()}")
                report = json.loads(driver.stdout_path.read_text().strip().splitlines()[-1])
            planned = PLANNED_LINE.findall(driver.stderr_path.read_text(errors="replace"))
            report["planning_ms"] = [float(v) for v in planned[0]] if planned else None
            results[name].append(report)
            print(f"  round {round_number + 1}: {name:34s} first batch {report['first_batch_s']:.2f} s after start()",
                  flush=True)
    return results


def commit_timings(bootstrap: str, batches: int, rows_per_batch: int, workdir: Path) -> list[tuple[float, ...]]:
    """(check, record, complete, cleanup) ms of each committed batch, and (tasks that went on with a cached
    producer, tasks) where the driver logs them, from the driver's log."""
    topic = create_topic(bootstrap, partitions=PARTITIONS)
    driver = run_driver(__file__, ["--streaming-driver", bootstrap, topic, str(workdir / "ck-stream"), str(batches),
                                   str(rows_per_batch)],
                        env={"KAFKA2PC_LOG_LEVEL": "INFO", "PYSPARK_PYTHON": sys.executable},
                        log_dir=workdir / "stream")
    if driver.wait(600) != 0:
        raise SystemExit(f"the streaming driver failed:\n{driver.output_tail()}")
    timings = [(float(m[3]), float(m[4]), float(m[5]), float(m[6]), int(m[7] or 0), int(m[8] or 0))
               for m in COMMIT_LINE.finditer(driver.stderr_path.read_text(errors="replace")) if int(m[2]) > 0]
    if len(timings) < batches // 2:
        raise SystemExit(f"only {len(timings)} commit lines in the driver's log:\n{driver.output_tail()}")
    return timings


def settle_outside_spark(bootstrap: str, batches: int, rows_per_batch: int, workdir: Path) -> list[tuple[float, ...]]:
    """(check, record, complete) ms of Committer.settle for ``batches`` checkpoints of 8 prepared transactions (one
    per subtask, its rows spread over the 8 partitions by key, as the streaming query's), in this process."""
    from kafka2pc.cluster import ClusterClient  # noqa: PLC0415
    from kafka2pc.config import ClientConfig  # noqa: PLC0415
    from kafka2pc.producer import TwoPhaseProducer  # noqa: PLC0415
    from kafka2pc.sink.integration import Committer, FileDecisionLog, PreparedTransaction  # noqa: PLC0415
    from kafka2pc.sink.naming import TransactionalIdGrammar  # noqa: PLC0415
    from kafka2pc.transaction_control import TransactionControl  # noqa: PLC0415

    topic = create_topic(bootstrap, partitions=PARTITIONS)
    prefix = f"bench-settle-{os.getpid()}"
    grammar = TransactionalIdGrammar(prefix)
    producers = [TwoPhaseProducer({"bootstrap.servers": bootstrap, "transactional.id": grammar.format(subtask, 0)},
                                  two_phase_commit=True) for subtask in range(PARTITIONS)]
    client = ClusterClient(ClientConfig.from_dict({"bootstrap.servers": bootstrap}))
    committer = Committer(TransactionControl(client), FileDecisionLog(workdir / "settle", prefix))
    per_task = rows_per_batch // PARTITIONS
    timings = []
    try:
        for producer in producers:
            producer.init_transactions()
        for checkpoint in range(batches + 1):  # checkpoint 0 warms the connections up, not counted
            offered = []
            for subtask, producer in enumerate(producers):
                producer.begin_transaction()
                keys = [str(subtask * per_task + row).encode() for row in range(per_task)]
                producer.produce_batch(topic, [b'{"id": "' + key + b'"}' for key in keys], keys)
                offered.append(PreparedTransaction(producer.transactional_id, producer.prepare_transaction(), subtask,
                                                   checkpoint))
            settlement = committer.settle(checkpoint, offered)
            for producer, transaction in zip(producers, offered, strict=True):
                producer.complete_transaction(transaction.state)  # the producer learns the outcome, as a task's does
            if checkpoint:
                timings.append((1000 * settlement.check_seconds, 1000 * settlement.record_seconds,
                                1000 * settlement.complete_seconds))
    finally:
        for producer in producers:
            producer.close()
        client.close()
    return timings


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def report_restarts(bootstrap: str, rounds: int, workdir: Path, *, killed: bool) -> None:
    """Print the restart figures of both sinks and where kafka2pc's first batch spends its time."""
    how = "SIGKILLed (driver, JVM and Python workers) while it ran on" if killed else "stopped"
    print(f"\nrestart to the first completed batch ({rounds} rounds; a query run for 3 batches, {how}, started "
          "again on its checkpoint; seconds from start()):", flush=True)
    restarts = restart_times(bootstrap, rounds, workdir, killed=killed)
    firsts = {name: statistics.median(r["first_batch_s"] for r in runs) for name, runs in restarts.items()}
    for name, runs in restarts.items():
        phases = {key: statistics.median(r["duration_ms"].get(key, 0) for r in runs)
                  for key in ("queryPlanning", "latestOffset", "walCommit", "addBatch", "commitOffsets")}
        print(f"  {name:34s} {firsts[name]:6.2f} s  (median durationMs of that batch: "
              + ", ".join(f"{key} {value:.0f}" for key, value in phases.items()) + ")")
    planning = [r["planning_ms"] for r in restarts[RESTART_SINKS[0]] if r["planning_ms"]]
    if planning:
        print("  kafka2pc's planning of that batch (median ms): " + ", ".join(
            f"{label} {statistics.median(p[i] for p in planning):.1f}"
            for i, label in enumerate(("total", "checkpoint state", "window move", "recovery"))))
    ours, peer = firsts.values()
    print(f"  kafka2pc - a Python sink without 2PC: {ours - peer:+.2f} s (goal <= +1 s)")


def report_driver_2pc(bootstrap: str, batches: int, rows_per_batch: int, workdir: Path) -> None:
    """Print the driver's 2PC time per micro-batch in Spark and the same settle outside it."""
    print(f"\ndriver 2PC time per micro-batch ({PARTITIONS} partitions, {rows_per_batch:,} rows per batch, "
          f"{batches} batches):", flush=True)
    timings = commit_timings(bootstrap, batches, rows_per_batch, workdir)
    outside = settle_outside_spark(bootstrap, batches, rows_per_batch, workdir)
    print(f"  {'':34s} {'in the Spark driver':>22s} {'same settle, no Spark':>24s}")
    print(f"  {'':34s} {'p50':>10s} {'p99':>11s} {'p50':>11s} {'p99':>11s}")
    in_spark = [t[:3] for t in timings]  # (check, record, complete), as ``outside``
    for column, name in enumerate(("check (8 DescribeTransactions)", "decision record", "completions (8 EndTxn)",
                                   "check + record + completions")):
        driver_ms = [sum(t) if column == 3 else t[column] for t in in_spark]
        peer_ms = [sum(t) if column == 3 else t[column] for t in outside]
        print(f"  {name:34s} {percentile(driver_ms, 0.5):7.1f} ms {percentile(driver_ms, 0.99):8.1f} ms "
              f"{percentile(peer_ms, 0.5):8.1f} ms {percentile(peer_ms, 0.99):8.1f} ms")
    cleanup = [t[3] for t in timings]
    continued, tasks = sum(t[4] for t in timings), sum(t[5] for t in timings)
    if tasks:
        print(f"  {'tasks that went on with a cached producer':34s} {continued} of {tasks} "
              f"({100 * continued / tasks:.0f} %)")
    print(f"  {'cleanup listing after':34s} {percentile(cleanup, 0.5):7.1f} ms {percentile(cleanup, 0.99):8.1f} ms")
    two_pc = statistics.median(sum(t) for t in in_spark) / statistics.median(sum(t) for t in outside)
    print(f"  ({len(timings)} batches; goal in Spark: check + record + completions p50 <= 15 ms, p99 <= 50 ms; "
          f"in Spark / outside: {two_pc:.2f}x)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", help="use this cluster instead of starting a local broker")
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--rows-per-batch", type=int, default=8_000)
    parser.add_argument("--restart-rounds", type=int, default=3, help="0: no restart measurement")
    parser.add_argument("--python-worker-reuse", choices=("true", "false"), default="true",
                        help="spark.python.worker.reuse for every session (default: Spark's, true)")
    parser.add_argument("--streaming-driver", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument("--restart-driver", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if not (args.streaming_driver or args.restart_driver):
        os.environ[REUSE_ENV] = args.python_worker_reuse
    if args.streaming_driver:
        bootstrap, topic, checkpoint, batches, rows_per_batch = args.streaming_driver
        return streaming_driver(bootstrap, topic, checkpoint, int(batches), int(rows_per_batch))
    if args.restart_driver:
        return restart_driver(*args.restart_driver)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kafka").setLevel(logging.CRITICAL)

    with bootstrap_or_local(args.bootstrap) as bootstrap, tempfile.TemporaryDirectory(prefix="k2pc-bench-") as work:
        print(f"broker {bootstrap}; {os.cpu_count()} CPUs; Spark local[2], spark.python.worker.reuse="
              f"{worker_reuse()}; {args.rows:,} rows in {PARTITIONS} partitions, {args.rounds} rounds", flush=True)
        fixed: dict[str, list[float]] = {name: [] for name in SINKS}
        cpu: dict[str, list[float]] = {name: [] for name in SINKS}
        fixed_cpu: dict[str, list[float]] = {name: [] for name in SINKS}
        results = throughput(bootstrap, args.rows, args.rounds, Path(work), fixed=fixed, cpu=cpu, fixed_cpu=fixed_cpu)
        medians = {name: statistics.median(values) for name, values in results.items()}
        print("\nthroughput (median of rounds, min-max); CPU: this process, Spark's JVM and its Python workers, "
              "user + system per row (median of rounds):")
        for name, values in results.items():
            print(f"  {name:34s} {medians[name]:>10,.0f} rows/s  ({min(values):,.0f}-{max(values):,.0f})  "
                  f"CPU {statistics.median(cpu[name]):6.2f} us/row")
        spark_sink, ours, floor = medians.values()
        print(f"  kafka2pc / Spark's Kafka sink: {ours / spark_sink:.2f}x (goal >= 1.0x); a Python sink that writes "
              f"nowhere / Spark's Kafka sink: {floor / spark_sink:.2f}x")
        print(f"\nfixed cost of a write ({PARTITIONS} rows, one per partition; median of {FIXED_COST_WRITES}):")
        fixed_ms = {name: statistics.median(values) for name, values in fixed.items()}
        for name, value in fixed_ms.items():
            print(f"  {name:34s} {value:7.0f} ms  CPU {statistics.median(fixed_cpu[name]):7.0f} ms")
        spark_ms, ours_ms, floor_ms = fixed_ms.values()
        print(f"  of kafka2pc's {ours_ms - spark_ms:.0f} ms more than Spark's sink, {floor_ms - spark_ms:.0f} ms are "
              f"any Python sink's (noop_arrow) and {ours_ms - floor_ms:.0f} ms kafka2pc's own (planning, the tasks' "
              "InitProducerId/window checks/flush, the driver's commit)")
        print("  rows/s beyond the fixed cost (rows / (median seconds of a write - its fixed cost)):")
        for name in SINKS:
            seconds = args.rows / medians[name] - fixed_ms[name] / 1000
            print(f"  {name:34s} {args.rows / seconds:>10,.0f} rows/s" if seconds > 0 else
                  f"  {name:34s}        n/a (a write took less than the fixed cost: too few rows to tell)")

        report_driver_2pc(bootstrap, args.batches, args.rows_per_batch, Path(work))
        for killed in (False, True) if args.restart_rounds > 0 else ():
            report_restarts(bootstrap, args.restart_rounds, Path(work), killed=killed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
