import pytest

pytest_plugins = ["kafka2pc.testing.pytest_plugin", "kafka2pc_harness.pytest_plugin", "pytester"]

#: The default suite's longest files (Spark drivers and executors killed and restarted: 30 s to 3 min a test). They
#: go first: ``make test``'s two workers (``-n 2 --dist load``) are handed the first tests alternately, so the long
#: ones are shared out at the start and the short ones fill the gaps, instead of one long test running alone at the
#: end (longest first; measured in the CI log's "slowest durations").
LONGEST_FIRST = ("test_storage_outages.py", "test_spark_foreach_batch.py", "test_spark_cluster_sink.py",
                 "test_spark_kills.py", "test_spark_batch_kills.py", "test_remote_checkpoints.py",
                 "test_spark_harness.py", "test_spark_connect.py", "test_dual_write_fleet.py", "test_secrets.py",
                 "test_model_based.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest files first (a stable sort: every file's tests keep their order, so module fixtures are set up once)."""
    rank = {name: position for position, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


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
