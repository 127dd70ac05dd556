"""A failed test keeps the broker logs and names where they are; a passing run leaves nothing behind."""

import pytest

from kafka2pc.testing import choose_backend

pytestmark = pytest.mark.integration

INNER = """
pytest_plugins = ["kafka2pc.testing.pytest_plugin"]

def test_uses_a_broker_and_passes(kafka_factory):
    kafka_factory()


def test_uses_a_broker_and_fails(kafka_factory):
    kafka_factory()
    assert False, "deliberate failure"
"""


# the harness's own behaviour, not kafka2pc's: make chaos runs it (-m slow), out of the default suite's time budget
@pytest.mark.slow
def test_failed_test_keeps_broker_logs(pytester, monkeypatch, tmp_path):
    if choose_backend() != "local":
        pytest.skip("log keeping is a local-backend feature")
    workdir = tmp_path / "work"
    monkeypatch.setenv("KAFKA2PC_WORKDIR", str(workdir))
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*kafka2pc broker logs*",
        f"*logs kept in {workdir}/kafka2pc-*/node-*/logs/server.log*",
    ])
    (kept,) = workdir.glob("kafka2pc-*/node-1/logs/server.log")  # the passing test's cluster left nothing
    assert "Transition from STARTING to STARTED" in kept.read_text()
