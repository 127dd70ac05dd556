"""kafka2pc shipped to a standalone cluster's executors in a packed virtual environment (``venv-pack``, passed with
``spark.archives``, as pyspark's docs describe), the executors' own Python lacking it; and a task whose Python lacks
kafka2pc failing with a message that says so. Slow (it builds and packs an environment): ``make test-archives``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from kafka2pc_harness.spark import run_driver

from .spark_support import audit

pytestmark = [pytest.mark.integration, pytest.mark.slow]
JOB = Path(__file__).with_name("spark_archives_job.py")
REPO = Path(__file__).resolve().parents[2]


def run(*command: str | Path) -> None:
    subprocess.run([str(c) for c in command], check=True, capture_output=True, timeout=900)


@pytest.fixture(scope="module")
def packed_environment(tmp_path_factory) -> Path:
    """kafka2pc (not editable: venv-pack refuses those) and what an executor needs (pyarrow, pandas), packed."""
    folder = tmp_path_factory.mktemp("packed")
    env = folder / "env"
    run(sys.executable, "-m", "venv", env)
    run(env / "bin" / "pip", "install", "--quiet", str(REPO), "pyarrow>=18,<27", "pandas>=2.2,<3", "venv-pack")
    run(env / "bin" / "venv-pack", "--prefix", env, "--output", folder / "env.tar.gz", "--quiet")
    return folder / "env.tar.gz"


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> Path:
    """A Python without kafka2pc (what a worker has before anything is installed), with pyarrow for Arrow tasks."""
    env = tmp_path_factory.mktemp("bare") / "env"
    run(sys.executable, "-m", "venv", env)
    run(env / "bin" / "pip", "install", "--quiet", "pyarrow>=18,<27", "pandas>=2.2,<3")
    return env / "bin" / "python"


def write(cluster, conf: dict[str, str], kafka, topic: str, folder: Path):
    # pyspark's driver sends PYSPARK_PYTHON with every Python function: it must name the executors' Python too
    python = {"PYSPARK_PYTHON": conf["spark.pyspark.python"], "PYSPARK_DRIVER_PYTHON": sys.executable}
    driver = run_driver(JOB, [json.dumps({**cluster.driver_conf(), **conf}), kafka.bootstrap_servers, topic,
                              str(folder / "ck")], env=python, log_dir=folder)
    code = driver.wait(timeout_s=600)
    return code, driver.stdout_path.read_text(), driver


@pytest.mark.timeout(1500)
def test_kafka2pc_shipped_with_spark_archives_writes_on_executors_whose_python_lacks_it(  # noqa: PLR0917
        spark_standalone, kafka, topic_factory, packed_environment, bare_python, tmp_path):
    topic = topic_factory(kafka, partitions=2)
    shipped = {"spark.archives": f"{packed_environment}#environment",
               "spark.pyspark.python": "./environment/bin/python",
               "spark.pyspark.driver.python": sys.executable}
    code, output, driver = write(spark_standalone, shipped, kafka, topic, tmp_path / "shipped")
    assert code == 0 and "written" in output, driver.output_tail()
    tasks = re.findall(r"task python=(\S+) kafka2pc=(\S+)", output)
    assert tasks, output
    for python, module in tasks:  # unpacked in the executor's work folder, not the node's Python
        assert "/environment/" in python and "/environment/" in module and str(REPO) not in module, (python, module)
    report = audit(kafka.bootstrap_servers, topic, 200)
    assert (report["records"], report["duplicates"], report["gaps"], report["clean"]) == (200, 0, 0, True)

    missing = {"spark.pyspark.python": str(bare_python), "spark.pyspark.driver.python": sys.executable}
    code, output, driver = write(spark_standalone, missing, kafka, topic, tmp_path / "missing")
    assert code == 1, driver.output_tail()
    assert "No module named 'kafka2pc'" in output, output[-3000:]
