"""Importing kafka2pc, its test helpers or its CLI loads no heavy optional dependency: pyspark, pytest,
confluent-kafka and testcontainers are imported by the functions that use them (a fresh interpreter per case, since
this one has them all loaded)."""

import json
import subprocess
import sys

import pytest

HEAVY = ("pyspark", "pytest", "confluent_kafka", "testcontainers")


def loaded_after(statement: str) -> list[str]:
    """The heavy top-level packages a fresh interpreter has loaded after running ``statement``."""
    probe = (f"import sys, json\n{statement}\n"
             f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules if m.split('.')[0] in {HEAVY!r}}})))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("statement", [
    "import kafka2pc; import kafka2pc.testing",
    "from kafka2pc.testing import BrokerSettings, start_kafka, LocalKafkaCluster, KafkaService",
    "import kafka2pc.cli",
])
def test_importing_loads_no_heavy_dependency(statement):
    assert loaded_after(statement) == []


def test_the_probe_sees_a_heavy_import():
    """The check is not vacuous: a module that imports one of them is seen."""
    assert loaded_after("import kafka2pc.testing.verify") == ["confluent_kafka"]
