import pytest

pytest_plugins = ["kafka2pc.testing.pytest_plugin", "kafka2pc.testing.spark_fixtures", "pytester"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """With ``-n 2 --dist loadgroup`` (``make test``) the integration tests run one after another on one worker (they
    share its brokers and Spark cluster, and their timing assumes a machine not running two of them), while the other
    worker runs the unit and model tests."""
    for item in items:
        path = str(item.path)
        if "/tests/integration/" in path:
            item.add_marker(pytest.mark.xdist_group("integration"))
