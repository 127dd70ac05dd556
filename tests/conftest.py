import pytest

pytest_plugins = ["kafka2pc.testing.pytest_plugin", "kafka2pc_harness.pytest_plugin", "pytester"]

#: Seconds each of the default suite's longest files takes (the files over ~8 s; from a ``--durations=0`` run of
#: b20194c). They are dealt out so that every xdist worker starts with its share of them.
LONG_FILES = {
    "test_dual_write.py": 131, "test_faults.py": 111, "test_spark_sink.py": 92, "test_spark_batch_kills.py": 79,
    "test_rolling_restart.py": 74, "test_spark_kills.py": 64, "test_cluster_failover.py": 61,
    "test_dual_write_keeper.py": 55, "test_spark_cluster_sink.py": 54, "test_producer_timeouts.py": 49,
    "test_remote_checkpoints.py": 44, "test_spark_connect.py": 43, "test_spark_foreach_batch.py": 40,
    "test_dual_write_mariadb.py": 38, "test_storage_outages.py": 37, "test_spark_harness.py": 36,
    "test_fault_proxy.py": 34, "test_sink_recovery.py": 33, "test_dual_write_fleet.py": 31,
    "test_fleet_frameworks.py": 29, "test_broker_gains_2pc.py": 29, "test_transaction_version_upgrade.py": 26,
    "test_wheel.py": 25, "test_secrets.py": 25, "test_model_based.py": 24, "test_cli_txns.py": 21,
    "test_dual_write_connections.py": 21, "test_topic_and_acl_changes.py": 20, "test_secured_kafka.py": 19,
    "test_dual_write_zombies.py": 16, "test_cli_fleet.py": 16, "test_review_mariadb_leases.py": 15,
    "test_doctor.py": 15, "test_dual_write_leases.py": 14, "test_dual_write_django.py": 13,
    "test_cluster_node_return.py": 12, "test_producer.py": 12, "test_s3_conditional_answers.py": 10,
    "test_dual_write_async.py": 9, "test_sink_reproduced.py": 8, "test_cli_audit.py": 8,
    "test_review_mariadb_claims.py": 8,
}


def _workers(config: pytest.Config) -> int:
    worker_input = getattr(config, "workerinput", None)  # set in an xdist worker
    if worker_input is not None:
        return int(worker_input["workercount"])
    return 1


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the tests for ``make test``'s ``-n 2 --dist worksteal``.

    Work stealing hands worker *i* the *i*-th contiguous block of the collection (blocks of equal count), and a worker
    that runs dry later takes the second half of another's queue. So each block starts with a share of the long files
    (dealt longest first to the block with the least long work so far: every worker has long tests to run from the
    start, and none is left running one alone at the end) and is filled up with the short tests. Every worker collects
    the same order (xdist checks), and a file's tests stay together and in order, so its module fixtures start once.
    """
    workers = _workers(config)
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.path.name, []).append(item)
    long_names = sorted((name for name in files if name in LONG_FILES), key=lambda name: -LONG_FILES[name])
    short = [item for name, group in files.items() if name not in LONG_FILES for item in group]
    sizes, remaining = [], len(items)
    for block in range(workers):  # the block sizes xdist's worksteal scheduler gives out
        sizes.append(remaining // (workers - block))
        remaining -= sizes[-1]
    blocks: list[list[pytest.Item]] = [[] for _ in range(workers)]
    seconds = [0] * workers
    for name in long_names:
        roomy = [b for b in range(workers) if len(blocks[b]) + len(files[name]) <= sizes[b]] or list(range(workers))
        chosen = min(roomy, key=lambda b: seconds[b])
        blocks[chosen].extend(files[name])
        seconds[chosen] += LONG_FILES[name]
    for block in range(workers):
        while len(blocks[block]) < sizes[block] and short:
            blocks[block].append(short.pop(0))
    items[:] = [item for block in blocks for item in block] + short


#: ``(test, text)`` a test recorded with ``record_property("ci_summary", text)``: figures the CI log must show (the
#: wheel's size, what installing it pulled in), printed after the run, also from xdist workers
_SUMMARIES: list[tuple[str, str]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call":
        _SUMMARIES.extend((report.nodeid, str(value)) for name, value in report.user_properties
                          if name == "ci_summary")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _SUMMARIES:
        terminalreporter.section("figures for the CI log")
        for nodeid, text in _SUMMARIES:
            terminalreporter.write_line(f"{nodeid}:\n{text}")
