"""The Spark part of the test harness: Spark's Kafka connector from Maven Central, local SparkSessions for tests, and
Spark drivers run as killable subprocesses. The standalone cluster is in :mod:`kafka2pc_harness.spark_cluster`;
pytest fixtures in :mod:`kafka2pc_harness.pytest_plugin`.

PySpark starts one JVM per Python process and allows one SparkContext in it: a test module shares one session, and a
driver that a test kills runs in its own process (:func:`run_driver`).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import IO, TYPE_CHECKING

from kafka2pc.testing.errors import HarnessSetupError
from kafka2pc.testing.jars import default_cache_dir, require_tool
from kafka2pc.testing.local import die_with_parent
from kafka2pc_harness.spark_cluster import (
    LOOPBACK,
    StandaloneSparkCluster,
    alive,
    descendants,
    kill_processes,
    process_table,
    pyspark_home,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

CONNECTOR = "org.apache.spark:spark-sql-kafka-0-10_2.13"
#: The newest spark-sql-kafka and spark-token-provider-kafka releases that Maven Central (as reached from here) had
#: when this was written; tried, within the same Spark major version, when the installed pyspark's own is missing.
FALLBACK_CONNECTOR_VERSION = "4.2.0"
FALLBACK_TOKEN_PROVIDER_VERSION = "4.0.0"
_MARKER = ".complete"
_JAR_NAME = re.compile(r"^(?P<artifact>.+?)-(?P<version>\d+\.[\w.\-]*)\.jar$")


# -- Spark's Kafka connector ---------------------------------------------------------------------------------------


def _artifact(jar_name: str) -> str:
    """``kafka-clients-3.9.2.jar`` -> ``kafka-clients``; ``spark-sql-kafka-0-10_2.13-4.2.0.jar`` -> its artifactId."""
    match = _JAR_NAME.match(jar_name)
    return match["artifact"] if match else jar_name.removesuffix(".jar")


def _candidates(spark_version: str) -> list[tuple[str, str]]:
    """(connector, token provider) versions to try, the installed pyspark's own first."""
    pairs = [(spark_version, spark_version)]
    if spark_version.split(".", maxsplit=1)[0] == FALLBACK_CONNECTOR_VERSION.split(".", maxsplit=1)[0]:
        pairs += [(spark_version, FALLBACK_TOKEN_PROVIDER_VERSION),
                  (FALLBACK_CONNECTOR_VERSION, FALLBACK_TOKEN_PROVIDER_VERSION)]
    return list(dict.fromkeys(pairs))


def _mvn_copy(mvn: str, connector: str, token: str, staging: Path) -> str | None:
    """Copy the connector's runtime jars into ``staging``; None on success, else Maven's last lines."""
    with resources.as_file(resources.files(__package__).joinpath("spark-kafka-pom.xml")) as pom:
        cmd = [mvn, "-B", "-q", "-f", str(pom), f"-Dspark.version={connector}", f"-Dspark.token.version={token}",
               f"-DoutputDirectory={staging}", "-DincludeScope=runtime", "dependency:copy-dependencies"]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=900)
    if proc.returncode == 0:
        return None
    return "\n".join(line for line in (proc.stdout + proc.stderr).strip().splitlines()[-6:] if line.strip())


def spark_kafka_jars(spark_version: str | None = None, *, cache_dir: Path | None = None) -> list[str]:
    """The jars to add to pyspark's classpath (``spark.jars``) for ``format("kafka")``: spark-sql-kafka-0-10 and its
    runtime dependencies, less what pyspark ships itself. ``spark_version`` defaults to the installed pyspark's.

    Resolved once with ``mvn`` into ``<cache>/spark-<version>/`` (cache: ``$KAFKA2PC_JARS_DIR``, as
    :mod:`kafka2pc.testing.jars`); the marker file, written last, records the versions Maven found.
    """
    home = pyspark_home()
    if spark_version is None:
        import pyspark  # noqa: PLC0415 - pyspark_home() checked that it is installed

        spark_version = pyspark.__version__
    cache = cache_dir or default_cache_dir()
    target = cache / f"spark-{spark_version}"
    if not (target / _MARKER).exists():
        _resolve_connector(spark_version, cache, target, home / "jars")
    return sorted(str(p) for p in target.glob("*.jar"))


def _resolve_connector(spark_version: str, cache: Path, target: Path, pyspark_jars: Path) -> None:
    mvn = require_tool("mvn", "to download Spark's Kafka connector from Maven Central")
    cache.mkdir(parents=True, exist_ok=True)
    shipped = {_artifact(p.name) for p in pyspark_jars.glob("*.jar")}
    failures = []
    for connector, token in _candidates(spark_version):
        staging = Path(tempfile.mkdtemp(prefix=f".spark-{spark_version}-", dir=cache))
        try:
            log.info("resolving %s:%s (token provider %s) into %s", CONNECTOR, connector, token, target)
            error = _mvn_copy(mvn, connector, token, staging)
            if error is not None:
                failures.append(f"connector {connector}, token provider {token}:\n{error}")
                continue
            if not any(staging.glob("spark-sql-kafka-0-10_2.13-*.jar")):
                raise HarnessSetupError(f"Maven finished but no spark-sql-kafka jar for {connector} is in {staging}")
            dropped = sorted(p.name for p in staging.glob("*.jar") if _artifact(p.name) in shipped)
            for name in dropped:
                (staging / name).unlink()
            if connector != spark_version or token != spark_version:
                log.warning("Maven could not provide %s %s with its token provider: using connector %s with token "
                            "provider %s", CONNECTOR, spark_version, connector, token)
            (staging / _MARKER).write_text(f"pyspark {spark_version}\nspark-sql-kafka {connector}\n"
                                           f"spark-token-provider-kafka {token}\n"
                                           f"left to pyspark: {' '.join(dropped)}\n")
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
            return
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    raise HarnessSetupError(f"Maven could not resolve {CONNECTOR} for pyspark {spark_version}:\n"
                            + "\n".join(failures))


# -- sessions ----------------------------------------------------------------------------------------------------

#: the Spark JVMs' log4j2 configuration: warnings and errors on stderr, Spark's startup noise off
LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss.SSS} %p %c{1}: %m%n%ex
logger.conf.name = org.apache.spark.SparkConf
logger.conf.level = error
logger.hadoop.name = org.apache.hadoop.util.NativeCodeLoader
logger.hadoop.level = error
"""


def python_env() -> dict[str, str]:
    """The environment variables that make Spark's Python workers run this interpreter, on loopback."""
    return {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable, "SPARK_LOCAL_IP": LOOPBACK}


def new_session(master: str, app_name: str, *, kafka_connector: bool = False,
                conf: Mapping[str, str] | None = None) -> SparkSession:
    """A SparkSession for ``master`` (``local[2]``, ``spark://...``): no UI, 2 shuffle partitions, this interpreter
    for Python workers, WARN logs, a temporary ``spark.local.dir``, the Kafka connector when asked. ``conf`` wins."""
    from pyspark import SparkContext  # noqa: PLC0415 - the spark extra is optional
    from pyspark.sql import SparkSession  # noqa: PLC0415

    if SparkContext._active_spark_context is not None:
        raise HarnessSetupError("a SparkContext already runs in this process (pyspark allows one): stop it first, "
                                "or run the other driver with run_driver()")
    os.environ.update(python_env())
    local_dir = Path(tempfile.mkdtemp(prefix="kafka2pc-spark-local-"))
    atexit.register(shutil.rmtree, local_dir, True)
    (local_dir / "log4j2.properties").write_text(LOG4J2)
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.local.dir": str(local_dir),
        "spark.driver.host": LOOPBACK,
        "spark.driver.bindAddress": LOOPBACK,
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{local_dir / 'log4j2.properties'}",
    }
    if kafka_connector:
        settings["spark.jars"] = ",".join(spark_kafka_jars())
    settings.update(conf or {})
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def local_session(app_name: str, *, cores: int = 2, kafka_connector: bool = False,
                  conf: Mapping[str, str] | None = None) -> SparkSession:
    """A ``local[cores]`` SparkSession for tests (see :func:`new_session`); end it with :func:`stop_session`."""
    settings = {"spark.sql.shuffle.partitions": str(cores), "spark.default.parallelism": str(cores), **(conf or {})}
    return new_session(f"local[{cores}]", app_name, kafka_connector=kafka_connector, conf=settings)


def stop_session(session: SparkSession, timeout_s: float = 30.0) -> None:
    """Stop ``session`` and its JVM (``session.stop()`` leaves pyspark's gateway JVM running until this process
    exits), and remove its temporary ``spark.local.dir``; a later session in this process starts a fresh JVM."""
    from pyspark import SparkContext  # noqa: PLC0415 - the spark extra is optional

    local_dir = session.conf.get("spark.local.dir")
    session.stop()
    gateway = SparkContext._gateway
    proc: subprocess.Popen[bytes] | None = getattr(gateway, "proc", None)
    if gateway is not None:
        gateway.shutdown()
        SparkContext._gateway = None
        SparkContext._jvm = None
    if proc is not None:
        if proc.stdin is not None:
            proc.stdin.close()  # the gateway JVM exits when its stdin closes
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_processes([proc.pid])
            proc.wait(timeout=timeout_s)
    if local_dir and Path(local_dir).name.startswith("kafka2pc-spark-local-"):
        shutil.rmtree(local_dir, ignore_errors=True)


# -- drivers as subprocesses ---------------------------------------------------------------------------------------


class DriverProcess:
    """A Spark driver script running in its own process group (its JVM and local-mode Python workers below it)."""

    def __init__(self, process: subprocess.Popen[bytes], stdout_path: Path, stderr_path: Path):
        self.process = process
        self.stdout_path = stdout_path
        self.stderr_path = stderr_path
        self._read = 0
        self._lines: list[str] = []
        self._partial = ""
        self._echoed = 0

    @property
    def pid(self) -> int:
        """The driver's Python process; also its process group id."""
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        """The exit code (negative: killed by that signal), None while it runs."""
        return self.process.poll()

    def wait(self, timeout_s: float) -> int:
        """Wait for the driver to exit; raise HarnessSetupError with its output after ``timeout_s``."""
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise HarnessSetupError(f"driver {self.pid} still runs after {timeout_s:g} s\n{self.output_tail()}") \
                from None

    def wait_for_line(self, pattern: str, timeout_s: float, *,
                      echo: Callable[[str], object] | None = None) -> re.Match[str]:
        """The first line of the driver's stdout matching ``pattern`` (``re.search``), waiting up to ``timeout_s``;
        HarnessSetupError, with its output, if it exits or the time runs out first. ``echo`` is called with each line
        not seen before, up to the match."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        checked = self._echoed if echo is not None else 0
        while True:
            exited = self.returncode is not None  # read after the exit check: no line printed before it is missed
            self._read_new()
            for index, line in enumerate(self._lines[checked:], start=checked):
                if echo is not None and index >= self._echoed:
                    echo(line)
                    self._echoed = index + 1
                if (match := regex.search(line)) is not None:
                    return match
            checked = len(self._lines)
            if exited or time.monotonic() > deadline:
                why = f"exited with {self.returncode}" if exited else f"printed none within {timeout_s:g} s"
                raise HarnessSetupError(f"driver {self.pid} {why}, waiting for /{pattern}/\n{self.output_tail()}")
            time.sleep(0.1)

    def group_pids(self) -> list[int]:
        """Every live process of the driver's group, and every process below them (pyspark's daemon makes its own
        group)."""
        table = process_table()
        members = [pid for pid, info in table.items() if info.pgid == self.pid]
        return sorted({*members, *(d for pid in members for d in descendants(pid, table))})

    def kill_group(self, timeout_s: float = 30.0) -> list[int]:
        """SIGKILL the driver's process group and every process below it, and wait until all are gone; returns the
        pids killed."""
        killed = kill_processes(self.group_pids(), timeout_s=timeout_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)  # anything of the group not seen by the scan
        self.wait(timeout_s)
        left = [pid for pid in killed if alive(pid)]
        if left:
            raise HarnessSetupError(f"processes {left} of driver {self.pid} outlived SIGKILL")
        return killed

    def output_tail(self, lines: int = 40) -> str:
        """The last lines of the driver's stdout and stderr."""
        parts = []
        for path in (self.stdout_path, self.stderr_path):
            text = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else []
            parts.append(f"--- {path} ---\n" + "\n".join(text))
        return "\n".join(parts)

    def _read_new(self) -> None:
        with self.stdout_path.open("rb") as out:
            out.seek(self._read)
            chunk = out.read()
        self._read += len(chunk)
        text = self._partial + chunk.decode(errors="replace")
        *complete, self._partial = text.split("\n")
        self._lines.extend(complete)


def run_driver(script_path: str | Path, args: Sequence[str] = (), *, env: Mapping[str, str] | None = None,
               log_dir: Path | None = None) -> DriverProcess:
    """Start ``python script_path args...`` (this interpreter, unbuffered) in its own process group, with its
    stdout and stderr written to files in ``log_dir`` (default: a new temporary folder)."""
    folder = log_dir or Path(tempfile.mkdtemp(prefix="kafka2pc-spark-driver-"))
    folder.mkdir(parents=True, exist_ok=True)
    stem = Path(script_path).stem
    stdout_path, stderr_path = folder / f"{stem}.stdout", folder / f"{stem}.stderr"
    full_env = {**os.environ, **python_env(), "PYTHONUNBUFFERED": "1", **(env or {})}
    out: IO[bytes]
    err: IO[bytes]
    with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-u", str(script_path), *args], env=full_env, stdout=out, stderr=err,
            stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=die_with_parent,  # noqa: PLW1509 - a tiny prctl call, before any thread exists in the child
        )
    log.info("started Spark driver %s (pid %d, output in %s)", script_path, process.pid, folder)
    return DriverProcess(process, stdout_path, stderr_path)


# -- command line ------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """``python -m kafka2pc_harness.spark jars [SPARK_VERSION]``: resolve Spark's Kafka connector ahead of tests."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    jars = commands.add_parser("jars", help="resolve spark-sql-kafka-0-10 and its dependencies with mvn")
    jars.add_argument("version", nargs="?", default=None, help="Spark version (default: the installed pyspark's)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        paths = spark_kafka_jars(args.version)
    except HarnessSetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"Spark Kafka connector: {len(paths)} jar(s) in {Path(paths[0]).parent if paths else '?'}")
    return 0


__all__ = [
    "DriverProcess",
    "StandaloneSparkCluster",
    "local_session",
    "new_session",
    "python_env",
    "run_driver",
    "spark_kafka_jars",
    "stop_session",
]

if __name__ == "__main__":
    raise SystemExit(main())
