"""An S3-API server for tests: moto's S3 app (the one s3fs's own test suite runs against) on a free loopback port,
with a bucket, and the environment an S3 client's standard chain reads (``AWS_ENDPOINT_URL_S3``, keys, region).

It honours conditional writes (``If-None-Match: *`` answers 412 when the key exists), which kafka2pc's decision log
on S3 relies on. It is served by :mod:`kafka2pc_harness.s3_server` (the same app and request handler as moto's
``moto_server``), so that an outage (:meth:`S3Server.stop_serving`, :meth:`S3Server.serve_again`) closes the port
and every connection while moto's in-memory data survives.

A Spark driver whose own checkpoint is on ``s3a://`` needs Hadoop's S3A filesystem, which pyspark does not ship:
:func:`s3a_jars` resolves hadoop-aws (pyspark's Hadoop version) and the AWS SDK bundle with ``mvn`` once, and
:meth:`S3Server.spark_environment` is what such a driver's environment needs (the jars on ``SPARK_DIST_CLASSPATH``,
S3A pointed at this server by a ``core-site.xml`` in ``HADOOP_CONF_DIR``)."""

from __future__ import annotations

import re
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from kafka2pc.testing.errors import HarnessSetupError
from kafka2pc.testing.jars import default_cache_dir, maven_dependencies
from kafka2pc.testing.local import free_ports
from kafka2pc_harness.proxy import LOOPBACK
from kafka2pc_harness.services import ServiceProcess


def pyspark_hadoop_version() -> str:
    """The Hadoop version of the installed pyspark's jars (``hadoop-client-api-<version>.jar``)."""
    from kafka2pc_harness.spark_cluster import pyspark_home  # noqa: PLC0415 - pyspark is optional

    for jar in (pyspark_home() / "jars").glob("hadoop-client-api-*.jar"):
        match = re.fullmatch(r"hadoop-client-api-(.+)\.jar", jar.name)
        if match:
            return match.group(1)
    raise HarnessSetupError(f"no hadoop-client-api jar in {pyspark_home() / 'jars'}")


def s3a_jars(hadoop_version: str | None = None) -> list[Path]:
    """hadoop-aws (of pyspark's Hadoop version by default) and its AWS SDK bundle, resolved with Maven into the jar
    cache on first use (about 700 MB)."""
    version = hadoop_version or pyspark_hadoop_version()
    target = maven_dependencies(default_cache_dir() / f"s3a-{version}", "s3a-pom.xml", {"hadoop.version": version},
                                what=f"Hadoop's S3A filesystem (hadoop-aws {version})", expect="hadoop-aws-*.jar",
                                timeout_s=1800, package="kafka2pc_harness")
    return sorted(target.glob("*.jar"))


class S3Server(ServiceProcess):
    """moto's S3 server on 127.0.0.1 and one bucket."""

    name = "s3"

    def __init__(self, bucket: str = "kafka2pc-tests"):
        super().__init__()
        self.bucket = bucket
        self.port = free_ports(1)[0]
        self.endpoint = f"http://{LOOPBACK}:{self.port}"
        #: the outages so far: (when stopped, when serving again), time.monotonic() moments
        self.outages: list[tuple[float, float]] = []
        self._stopped_at: float | None = None

    def environment(self) -> dict[str, str]:
        """The variables an S3 client's standard chain reads (boto3/s3fs)."""
        return {"AWS_ENDPOINT_URL_S3": self.endpoint, "AWS_ACCESS_KEY_ID": "kafka2pc-test",
                "AWS_SECRET_ACCESS_KEY": "kafka2pc-test-secret", "AWS_DEFAULT_REGION": "us-east-1"}

    def spark_environment(self) -> dict[str, str]:
        """The environment of a Spark driver (local mode) whose own checkpoint is on ``s3a://`` this server: S3A's
        jars on ``SPARK_DIST_CLASSPATH`` and a ``core-site.xml`` (endpoint, path-style access, keys) in
        ``HADOOP_CONF_DIR``, besides :meth:`environment` for kafka2pc's s3fs."""
        conf_dir = self.workdir / "s3a-conf"
        if not conf_dir.exists():
            conf_dir.mkdir()
            keys = self.environment()
            settings = {"fs.s3a.endpoint": self.endpoint, "fs.s3a.endpoint.region": keys["AWS_DEFAULT_REGION"],
                        "fs.s3a.path.style.access": "true", "fs.s3a.connection.ssl.enabled": "false",
                        "fs.s3a.access.key": keys["AWS_ACCESS_KEY_ID"],
                        "fs.s3a.secret.key": keys["AWS_SECRET_ACCESS_KEY"],
                        "fs.s3a.aws.credentials.provider":
                            "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"}
            properties = "".join(f"<property><name>{k}</name><value>{v}</value></property>"
                                 for k, v in settings.items())
            (conf_dir / "core-site.xml").write_text(f"<?xml version=\"1.0\"?><configuration>{properties}"
                                                    "</configuration>\n")
        return {**self.environment(), "HADOOP_CONF_DIR": str(conf_dir),
                "SPARK_DIST_CLASSPATH": ":".join(str(jar) for jar in s3a_jars())}

    def _bucket_request(self, method: str) -> bool:
        """Whether the server answered ``method`` on the bucket (PUT creates it, HEAD looks at it)."""
        try:
            request = urllib.request.Request(f"{self.endpoint}/{self.bucket}", method=method)
            urllib.request.urlopen(request, timeout=2).close()
        except OSError:  # refused, reset, or a server too busy to answer within the timeout: asked again
            return False
        return True

    def _refused(self) -> bool:
        try:
            socket.create_connection((LOOPBACK, self.port), timeout=2).close()
        except ConnectionRefusedError:
            return True
        except OSError:
            return False  # accepted while the listening socket was being closed, then reset
        return False

    def start(self) -> S3Server:
        """Start the server and create the bucket."""
        try:
            import moto.moto_server.werkzeug_app  # noqa: F401, PLC0415 - only to say what is missing
        except ImportError:
            raise HarnessSetupError("moto's server is missing: pip install 'moto[server]' (kafka2pc's dev extra)") \
                from None
        self._launch([sys.executable, "-m", "kafka2pc_harness.s3_server", "--host", LOOPBACK, "--port", str(self.port)],
                     lambda: self._bucket_request("PUT"), timeout_s=30)
        return self

    def _signal_and_wait(self, signal_number: int, done: Callable[[], bool], what: str) -> None:
        process = self._process
        if process is None or process.poll() is not None:
            raise HarnessSetupError(f"the S3 server is not running (work folder {self.workdir})")
        process.send_signal(signal_number)
        deadline = time.monotonic() + 30
        while not done():
            if process.poll() is not None or time.monotonic() > deadline:
                tail = self.log_file.read_text(errors="replace")[-1500:]
                raise HarnessSetupError(f"the S3 server did not {what}:\n{tail}")
            time.sleep(0.05)

    def stop_serving(self) -> None:
        """Close the port and every open connection (moto's data stays in the server's memory)."""
        self._signal_and_wait(signal.SIGUSR1, self._refused, "stop serving")
        self._stopped_at = time.monotonic()

    def serve_again(self) -> None:
        """Listen on the same port again; returns once the bucket answers."""
        self._signal_and_wait(signal.SIGUSR2, lambda: self._bucket_request("HEAD"), "serve again")
        if self._stopped_at is not None:
            self.outages.append((self._stopped_at, time.monotonic()))
            self._stopped_at = None
