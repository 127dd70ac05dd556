"""A real MariaDB server for tests: Debian's binaries (``mariadb-server`` package) started in a temporary folder on a
free loopback port, or an existing server named by ``KAFKA2PC_MARIADB_URL`` (``mysql://user[:password]@host:port/db``).

The server runs as the user that starts it (``--user=root`` when that is root); its ``root@127.0.0.1`` has no
password (``mariadb-install-db --auth-root-authentication-method=normal``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kafka2pc.testing.errors import HarnessSetupError
from kafka2pc.testing.local import free_ports
from kafka2pc_harness.services import stop_process

URL_VARIABLE = "KAFKA2PC_MARIADB_URL"


def _binary(name: str) -> str:
    found = shutil.which(name) or next((str(p) for p in (Path("/usr/sbin") / name,) if p.exists()), None)
    if found is None:
        raise HarnessSetupError(f"MariaDB's {name} is missing: install Debian's package (apt-get install "
                                f"mariadb-server) or set {URL_VARIABLE} to an existing server")
    return found


class MariaDBServer:
    """One MariaDB data folder (mariadb-install-db) and its server on 127.0.0.1, database ``kafka2pc``."""

    def __init__(self, workdir: Path | None = None):
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="kafka2pc-mariadb-"))
        self.data = self.workdir / "data"
        self.port = free_ports(1)[0]
        self.log_file = self.workdir / "mariadb.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mysql://root@127.0.0.1:{self.port}/kafka2pc"

    def start(self, timeout_s: float = 60.0) -> MariaDBServer:
        """Install the system tables, start the server, wait until it accepts connections, create the database."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        user = ["--user=root"] if os.geteuid() == 0 else []
        install = subprocess.run([_binary("mariadb-install-db"), "--no-defaults", f"--datadir={self.data}", *user,
                                  "--auth-root-authentication-method=normal", "--skip-test-db"],
                                 capture_output=True, text=True, check=False)
        if install.returncode != 0:
            raise HarnessSetupError(f"mariadb-install-db failed ({install.returncode}): {install.stderr[-2000:]}")
        self._process = subprocess.Popen(
            [_binary("mariadbd"), "--no-defaults", f"--datadir={self.data}", *user, f"--port={self.port}",
             "--bind-address=127.0.0.1", f"--socket={self.workdir / 'mariadb.sock'}",
             f"--pid-file={self.workdir / 'mariadb.pid'}", f"--log-error={self.log_file}", "--skip-name-resolve",
             "--innodb-buffer-pool-size=64M", "--innodb-log-file-size=16M", "--max-connections=200",
             "--innodb-flush-log-at-trx-commit=1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with contextlib.closing(connect(f"mysql://root@127.0.0.1:{self.port}/")) as connection:
                    connection.cursor().execute("CREATE DATABASE IF NOT EXISTS kafka2pc")
                return self
            except Exception as exc:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    tail = self.log_file.read_text(errors="replace")[-2000:] if self.log_file.exists() else ""
                    self.close()
                    raise HarnessSetupError(f"MariaDB did not start on port {self.port} ({exc!r}):\n{tail}") from exc
                time.sleep(0.2)

    def close(self) -> None:
        """Stop the server and remove its folder."""
        stop_process(self._process)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> MariaDBServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(url: str, *, factory: Any = None, **options: Any) -> Any:
    """A PyMySQL connection (``factory``: a subclass of PyMySQL's Connection) to
    ``mysql://user[:password]@host:port/database``, autocommit off (PyMySQL's default)."""
    import pymysql  # noqa: PLC0415 - only tests that use MariaDB need it

    parts = urlsplit(url)
    return (factory or pymysql.connections.Connection)(
        host=parts.hostname or "127.0.0.1", port=parts.port or 3306, user=parts.username or "root",
        password=parts.password or "", database=parts.path.lstrip("/") or None, **options)


@contextlib.contextmanager
def mariadb_url() -> Iterator[str]:
    """``KAFKA2PC_MARIADB_URL`` when set, else the URL of a server started for the block."""
    existing = os.environ.get(URL_VARIABLE)
    if existing:
        yield existing
        return
    with MariaDBServer() as server:
        yield server.url
