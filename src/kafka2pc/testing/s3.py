"""An S3-API server for tests: moto's server (the one s3fs's own test suite runs against) on a free loopback port,
with a bucket, and the environment an S3 client's standard chain reads (``AWS_ENDPOINT_URL_S3``, keys, region).

It honours conditional writes (``If-None-Match: *`` answers 412 when the key exists), which kafka2pc's decision log
on S3 relies on."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from kafka2pc.testing.errors import HarnessSetupError
from kafka2pc.testing.local import free_ports
from kafka2pc.testing.proxy import LOOPBACK

_START_S = 30.0


class S3Server:
    """moto's S3 server on 127.0.0.1 and one bucket; :meth:`environment` is what clients need."""

    def __init__(self, bucket: str = "kafka2pc-tests"):
        self.bucket = bucket
        self.port = free_ports(1)[0]
        self.endpoint = f"http://{LOOPBACK}:{self.port}"
        self.workdir = Path(tempfile.mkdtemp(prefix="kafka2pc-s3-"))
        self._process: subprocess.Popen[bytes] | None = None

    def environment(self) -> dict[str, str]:
        """The variables an S3 client's standard chain reads (boto3/s3fs, and Spark's S3A via the same names)."""
        return {"AWS_ENDPOINT_URL_S3": self.endpoint, "AWS_ACCESS_KEY_ID": "kafka2pc-test",
                "AWS_SECRET_ACCESS_KEY": "kafka2pc-test-secret", "AWS_DEFAULT_REGION": "us-east-1"}

    def start(self) -> S3Server:
        """Start the server, wait until it answers, and create the bucket."""
        server = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or shutil.which("moto_server")
        if server is None:
            raise HarnessSetupError("moto's server is missing: pip install 'moto[server]' (kafka2pc's dev extra)")
        log = (self.workdir / "moto.log").open("wb")
        self._process = subprocess.Popen([server, "-H", LOOPBACK, "-p", str(self.port)], stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + _START_S
        while True:
            if self._process.poll() is not None:
                raise HarnessSetupError(f"moto's server exited with {self._process.returncode}: "
                                        f"{(self.workdir / 'moto.log').read_text()[-2000:]}")
            try:
                request = urllib.request.Request(f"{self.endpoint}/{self.bucket}", method="PUT")
                urllib.request.urlopen(request, timeout=2).close()
                return self
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() > deadline:
                    raise HarnessSetupError(f"moto's server did not answer on {self.endpoint} within "
                                            f"{_START_S:g} s") from None
                time.sleep(0.2)

    def close(self) -> None:
        """Stop the server (its process, by pid) and remove its folder."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def apply_environment(variables: Mapping[str, str]) -> dict[str, str | None]:
    """Set ``variables`` in this process's environment (child processes inherit them); returns what they were, for
    :func:`restore_environment`."""
    previous = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    return previous


def restore_environment(previous: dict[str, str | None]) -> None:
    """Undo :func:`apply_environment`."""
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
