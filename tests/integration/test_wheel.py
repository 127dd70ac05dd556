"""The package users install, as CI ships it: the sdist and the wheel built by ``python -m build`` (the wheel from the
sdist), checked by ``twine check``, and the wheel installed into a clean venv (no system site packages, no pip, its
dependencies from PyPI). There the CLI answers, ``kafka2pc doctor`` reads the test broker, a TwoPhaseProducer and a
DualWriter (SQLite) round trip commit what a read_committed consumer then sees, and importing kafka2pc loads none of
pyspark, pytest, confluent-kafka and testcontainers. The wheel's size and what ``pip install kafka2pc`` pulled in
go to the CI log (tests/conftest.py prints them after the run)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import pytest

from kafka2pc.testing.verify import read_records, values

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
ROUND_TRIP = Path(__file__).with_name("wheel_roundtrip.py")
#: what only kafka2pc's own harness (harness/, a second distribution) holds
NOT_SHIPPED = ("kafka2pc_harness/", "kafka2pc/testing/spark", "kafka2pc/testing/proxy", "kafka2pc/testing/postgres",
               "kafka2pc/testing/hdfs", "kafka2pc/testing/s3", "kafka2pc/testing/secured", "kafka2pc/testing/oidc")


@dataclasses.dataclass(frozen=True)
class Installed:
    """The built distributions and the clean venv the wheel went into."""

    wheel: Path
    sdist: Path
    twine: str
    venv: Path
    freeze: str
    build_s: float
    install_s: float

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"


def run(*command: str | Path, timeout_s: float = 600) -> str:
    """Run ``command`` outside the repository, without the variables that would let a venv's Python see the dev
    environment's packages; its stdout, or a failure with its output."""
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=timeout_s, check=False,
                          env=environment, cwd=tempfile.gettempdir())
    assert done.returncode == 0, f"{command} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    """Build, check and install the wheel into a clean venv."""
    started = time.monotonic()
    dist = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--outdir", dist, REPO)
    built = time.monotonic()
    (wheel,) = dist.glob("kafka2pc-*.whl")
    (sdist,) = dist.glob("kafka2pc-*.tar.gz")
    twine = run(sys.executable, "-m", "twine", "check", "--strict", wheel, sdist)
    venv = tmp_path_factory.mktemp("clean") / "venv"
    # no pip in it either (ensurepip costs seconds): this environment's pip installs into it (--python)
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    pip = (sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "--disable-pip-version-check")
    run(*pip, "install", "--quiet", wheel)
    freeze = run(*pip, "freeze")
    return Installed(wheel, sdist, twine, venv, freeze, built - started, time.monotonic() - built)


def test_the_wheel_holds_the_runtime_and_not_the_harness(installed, record_property):
    names = zipfile.ZipFile(installed.wheel).namelist()
    assert "kafka2pc/__init__.py" in names and "pyspark_kafka2pc/__init__.py" in names
    assert "kafka2pc/testing/broker-pom.xml" in names and "kafka2pc/testing/log4j2.properties" in names
    assert [n for n in names if n.startswith(NOT_SHIPPED)] == []
    assert installed.twine.count("PASSED") == 2, installed.twine
    metadata = next(zipfile.ZipFile(installed.wheel).read(n).decode() for n in names if n.endswith("/METADATA"))
    assert "Provides-Extra: audit" in metadata
    record_property("ci_summary", (
        f"{installed.wheel.name}: {installed.wheel.stat().st_size:,} bytes, {len(names)} files; "
        f"{installed.sdist.name}: {installed.sdist.stat().st_size:,} bytes; built in {installed.build_s:.0f} s, "
        f"installed into a clean venv in {installed.install_s:.0f} s.\n"
        f"pip install kafka2pc pulled in (pip freeze):\n{installed.freeze.rstrip()}"))


def test_importing_kafka2pc_from_the_wheel_loads_nothing_heavy(installed):
    probe = ("import kafka2pc, sys; print(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('pyspark','pytest','confluent_kafka','testcontainers')))")
    assert run(installed.python, "-I", "-c", probe).strip() == "[]"
    where = run(installed.python, "-I", "-c", "import kafka2pc; print(kafka2pc.__file__)").strip()
    assert where.startswith(str(installed.venv)), where  # the wheel's copy, not the repository's
    pulled = {line.split("==")[0].lower() for line in installed.freeze.splitlines()}
    assert pulled & {"pyspark", "pytest", "confluent-kafka", "testcontainers"} == set()


def test_the_cli_and_doctor_answer(installed, kafka):
    cli = installed.venv / "bin" / "kafka2pc"
    assert "doctor" in run(cli, "--help")
    report = json.loads(run(cli, "doctor", "--bootstrap", kafka.bootstrap_servers, "--json",
                            "--probe-id", f"wheel-doctor-{os.getpid()}"))
    assert report["enable_2pc"] is True and report["init_producer_id_max_version"] == 6


def test_a_two_phase_producer_and_a_dual_writer_round_trip(installed, kafka, topic_factory, tmp_path):
    producer_topic, dual_topic = topic_factory(kafka), topic_factory(kafka, partitions=2)
    database = tmp_path / "orders.db"
    output = run(installed.python, "-I", ROUND_TRIP, kafka.bootstrap_servers, producer_topic, dual_topic, database)
    result = json.loads(output.strip().splitlines()[-1])
    assert result == {"outcome": "COMMITTED", "two_phase_commit_active": True, "dual_write_two_phase": True}
    assert values(read_records(kafka.client_config, producer_topic)) == [b"a", b"b"]
    events = read_records(kafka.client_config, dual_topic)
    assert sorted(json.loads(v or b"")["id"] for v in values(events)) == [1, 2, 3]
    with contextlib.closing(sqlite3.connect(database)) as connection:
        assert [row[0] for row in connection.execute("SELECT id FROM orders ORDER BY id")] == [1, 2, 3]
