"""What the harness's storage servers share (moto's S3, fake-gcs-server, Azurite, the mini HDFS cluster): a process
on free loopback ports with a work folder, started until it answers and stopped by its pid, and the environment
variables through which clients (and the Spark drivers that tests start) find it.

A server that supports outages (the mini HDFS cluster, moto's S3 server) stops serving with :meth:`stop_serving`
and serves again, with its data and on the same ports, with :meth:`serve_again`; :meth:`outage` is both around a
block."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from kafka2pc.testing.errors import HarnessSetupError


class ServiceProcess:
    """A server process with a work folder; subclasses start it with :meth:`_launch` and say :meth:`environment`."""

    name = "service"

    def __init__(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix=f"kafka2pc-{self.name}-"))
        self.log_file = self.workdir / "server.log"
        self._process: subprocess.Popen[bytes] | None = None

    def _launch(self, command: list[str], answers: Callable[[], bool], *, timeout_s: float = 60.0,
                append: bool = False) -> None:
        """Start ``command`` (output to :attr:`log_file`, appended to it with ``append``) and wait until
        ``answers()``; HarnessSetupError with the log's tail if it exits or the time runs out first."""
        with self.log_file.open("ab" if append else "wb") as log:
            self._process = subprocess.Popen(command, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        try:
            while not answers():
                if self._process.poll() is not None or time.monotonic() > deadline:
                    tail = self.log_file.read_text(errors="replace")[-2500:]
                    raise HarnessSetupError(f"{self.name} did not start (work folder {self.workdir}):\n{tail}")
                time.sleep(0.2)
        except BaseException:
            if self._process.poll() is None:  # a server that never answered is not left running
                self._process.kill()
                self._process.wait(timeout=30)
            raise

    @property
    def pid(self) -> int | None:
        """The server process's pid while it runs."""
        return self._process.pid if self._process is not None and self._process.poll() is None else None

    def environment(self) -> dict[str, str]:
        """The variables a client reads to find this service."""
        return {}

    def stop_serving(self) -> None:
        """Stop answering clients (connections refused) until :meth:`serve_again`, keeping the data."""
        raise NotImplementedError(f"{self.name} has no outages")

    def serve_again(self) -> None:
        """Answer clients again after :meth:`stop_serving`, on the same ports and with the same data; returns once
        the server serves."""
        raise NotImplementedError(f"{self.name} has no outages")

    @contextmanager
    def outage(self) -> Iterator[None]:
        """The server down for the block (:meth:`stop_serving`), then serving again (:meth:`serve_again`, also when
        the block raises)."""
        self.stop_serving()
        try:
            yield
        finally:
            self.serve_again()

    def close(self) -> None:
        """Stop the process (by its pid) and remove the work folder."""
        stop_process(self._process)
        shutil.rmtree(self.workdir, ignore_errors=True)


def stop_process(process: subprocess.Popen[bytes] | None, stop: signal.Signals = signal.SIGTERM) -> None:
    """Signal a server process this harness started (SIGTERM, or ``stop``), wait up to 30 s, then SIGKILL it
    (nothing if it has ended)."""
    if process is not None and process.poll() is None:
        process.send_signal(stop)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@contextmanager
def environment_set(variables: Mapping[str, str]) -> Iterator[None]:
    """``variables`` set in this process's environment (child processes inherit them) for the block, then
    restored."""
    previous = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
