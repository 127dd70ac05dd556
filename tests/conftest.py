import pytest

pytest_plugins = ["kafka2pc.testing.pytest_plugin", "kafka2pc_harness.pytest_plugin", "pytester"]

#: The default suite's longest files (Spark drivers and executors killed and restarted: 30 s to 3 min a test). They
#: go first: ``make test``'s two workers (``-n 2 --dist load``) are handed the first tests alternately, so the long
#: ones are shared out at the start and the short ones fill the gaps, instead of one long test running alone at the
#: end (longest first; measured in the CI log's "slowest durations").
LONGEST_FIRST = ("test_spark_kills.py", "test_remote_checkpoints.py", "test_spark_foreach_batch.py",
                 "test_spark_cluster_sink.py", "test_spark_batch_kills.py", "test_spark_harness.py",
                 "test_secrets.py", "test_model_based.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest files first (a stable sort: every file's tests keep their order, so module fixtures are set up once)."""
    rank = {name: position for position, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
