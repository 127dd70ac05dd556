"""Resolve Apache Kafka broker jars from Maven Central with the machine's ``mvn``.

The jars of each version are copied into ``<cache>/<version>/`` and a marker file is written last, so an
interrupted download is never mistaken for a complete one.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path

from kafka2pc.testing.errors import HarnessSetupError

log = logging.getLogger(__name__)

#: The newest Apache Kafka release on Maven Central when this was written; it has KIP-939's Enable2Pc.
NEWEST_KAFKA_VERSION = "4.4.0"
#: The last release before KIP-939: no InitProducerId v6, no ListTransactions pattern filter.
PRE_2PC_KAFKA_VERSION = "3.9.2"

_MARKER = ".complete"
_ENV_CACHE = "KAFKA2PC_JARS_DIR"


def default_cache_dir() -> Path:
    """Where jars are kept: ``$KAFKA2PC_JARS_DIR``, else ``~/.cache/kafka2pc/kafka-jars``."""
    configured = os.environ.get(_ENV_CACHE)
    if configured:
        return Path(configured).expanduser().resolve()
    return Path.home() / ".cache" / "kafka2pc" / "kafka-jars"


def require_tool(name: str, what_for: str) -> str:
    """Return the path of an executable or raise one clear error saying what to install."""
    path = shutil.which(name)
    if path is None:
        raise HarnessSetupError(
            f"`{name}` was not found on PATH; it is needed {what_for}. Install Java 17+ and Maven "
            "(Debian/Ubuntu: `apt-get install openjdk-17-jre-headless maven`), or point the tests at an existing "
            "cluster with KAFKA2PC_BOOTSTRAP=host:port."
        )
    return path


def maven_dependencies(target: Path, pom: str, properties: dict[str, str], *, what: str, expect: str,
                       runtime_only: bool = True, timeout_s: float = 900,
                       package: str = "kafka2pc.testing") -> Path:
    """``target``, holding the dependencies of ``pom`` (a resource of ``package``, this one by default) resolved with
    Maven under ``properties``, once: they are copied into a staging folder, renamed into place when complete (a file
    matching ``expect`` arrived), and kept from then on. ``what`` names them in messages."""
    if (target / _MARKER).exists():
        return target
    mvn = require_tool("mvn", f"to download {what} from Maven Central")
    target.parent.mkdir(parents=True, exist_ok=True)
    log.info("resolving %s into %s", what, target)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        with resources.as_file(resources.files(package).joinpath(pom)) as pom_file:
            cmd = [mvn, "-B", "-q", "-f", str(pom_file), *(f"-D{k}={v}" for k, v in properties.items()),
                   f"-DoutputDirectory={staging}", *(["-DincludeScope=runtime"] if runtime_only else []),
                   "dependency:copy-dependencies"]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=timeout_s)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
            raise HarnessSetupError(f"Maven could not resolve {what}:\n{tail}")
        if not any(staging.glob(expect)):
            raise HarnessSetupError(f"Maven finished but no {expect} of {what} arrived in {staging}")
        (staging / _MARKER).write_text(" ".join(properties.values()) + "\n")
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def jars_dir(version: str, cache_dir: Path | None = None) -> Path:
    """The folder holding the jars of ``version``, resolving them with Maven first if needed."""
    return maven_dependencies((cache_dir or default_cache_dir()) / version, "broker-pom.xml",
                              {"kafka.version": version}, what=f"Apache Kafka {version}", expect="kafka_2.13-*.jar")


def classpath(version: str, cache_dir: Path | None = None) -> str:
    """A java ``-cp`` value with every jar of ``version``."""
    return str(jars_dir(version, cache_dir) / "*")


def main(argv: list[str] | None = None) -> int:
    """``python -m kafka2pc.testing.jars [VERSION ...]``: resolve jars ahead of a test run."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("versions", nargs="*", default=[NEWEST_KAFKA_VERSION, PRE_2PC_KAFKA_VERSION])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        for version in args.versions:
            print(f"Apache Kafka {version}: {jars_dir(version)}")
    except HarnessSetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
