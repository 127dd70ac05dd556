"""An S3-API server for tests: moto's server (the one s3fs's own test suite runs against) on a free loopback port,
with a bucket, and the environment an S3 client's standard chain reads (``AWS_ENDPOINT_URL_S3``, keys, region).

It honours conditional writes (``If-None-Match: *`` answers 412 when the key exists), which kafka2pc's decision log
on S3 relies on."""

from __future__ import annotations

import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path

from kafka2pc.testing.errors import HarnessSetupError
from kafka2pc.testing.local import free_ports
from kafka2pc.testing.proxy import LOOPBACK
from kafka2pc.testing.services import ServiceProcess


class S3Server(ServiceProcess):
    """moto's S3 server on 127.0.0.1 and one bucket."""

    name = "s3"

    def __init__(self, bucket: str = "kafka2pc-tests"):
        super().__init__()
        self.bucket = bucket
        self.port = free_ports(1)[0]
        self.endpoint = f"http://{LOOPBACK}:{self.port}"

    def environment(self) -> dict[str, str]:
        """The variables an S3 client's standard chain reads (boto3/s3fs)."""
        return {"AWS_ENDPOINT_URL_S3": self.endpoint, "AWS_ACCESS_KEY_ID": "kafka2pc-test",
                "AWS_SECRET_ACCESS_KEY": "kafka2pc-test-secret", "AWS_DEFAULT_REGION": "us-east-1"}

    def _bucket_created(self) -> bool:
        try:
            request = urllib.request.Request(f"{self.endpoint}/{self.bucket}", method="PUT")
            urllib.request.urlopen(request, timeout=2).close()
        except (urllib.error.URLError, ConnectionError):
            return False
        return True

    def start(self) -> S3Server:
        """Start the server and create the bucket."""
        server = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or shutil.which("moto_server")
        if server is None:
            raise HarnessSetupError("moto's server is missing: pip install 'moto[server]' (kafka2pc's dev extra)")
        self._launch([server, "-H", LOOPBACK, "-p", str(self.port)], self._bucket_created, timeout_s=30)
        return self
