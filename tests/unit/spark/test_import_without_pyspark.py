"""Importing kafka2pc.spark where PySpark is not installed names the extra to install."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_spark_package_without_pyspark_names_the_extra():
    probe = ("import sys; sys.modules['pyspark'] = None\n"  # as if not installed: import raises ModuleNotFoundError
             "try:\n    import kafka2pc.spark\nexcept ModuleNotFoundError as exc:\n    print(exc.name, '|', exc)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "pyspark | kafka2pc.spark needs PySpark: pip install 'kafka2pc[spark]'"
