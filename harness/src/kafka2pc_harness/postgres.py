"""A real PostgreSQL server for tests: Debian's binaries (``postgresql`` package) started in a temporary folder on a
free loopback port, or an existing server named by ``KAFKA2PC_POSTGRES_DSN``.

PostgreSQL refuses to run as root: started by root, the server runs as ``nobody`` (its folder chowned to it)."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from kafka2pc.testing.errors import HarnessSetupError
from kafka2pc.testing.local import free_ports
from kafka2pc_harness.services import stop_process

DSN_VARIABLE = "KAFKA2PC_POSTGRES_DSN"
_RUN_AS = "nobody"


def postgres_bin_dir() -> Path:
    """The folder of ``initdb``/``postgres``: ``pg_config --bindir``, else the newest /usr/lib/postgresql/N/bin."""
    found = shutil.which("pg_config")
    if found:
        with contextlib.suppress(subprocess.CalledProcessError, OSError):
            answer = subprocess.run([found, "--bindir"], check=True, capture_output=True, text=True)
            bindir = Path(answer.stdout.strip())
            if (bindir / "initdb").exists():
                return bindir
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if not candidates:
        raise HarnessSetupError("PostgreSQL's server binaries are missing: install Debian's package "
                                "(apt-get install postgresql) or set KAFKA2PC_POSTGRES_DSN to an existing server")
    return Path(candidates[-1]).parent


def _demote() -> None:  # pragma: no cover - runs in the child before exec
    user = pwd.getpwnam(_RUN_AS)
    os.setgid(user.pw_gid)
    os.setuid(user.pw_uid)


class PostgresServer:
    """One PostgreSQL cluster (initdb) and its server, on 127.0.0.1, trust authentication, database ``postgres``."""

    def __init__(self, workdir: Path | None = None):
        self.bin = postgres_bin_dir()
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="kafka2pc-postgres-"))
        self.data = self.workdir / "data"
        self.port = free_ports(1)[0]
        self.log_file = self.workdir / "postgres.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._demote = os.geteuid() == 0
        self.user = _RUN_AS if self._demote else pwd.getpwuid(os.geteuid()).pw_name

    @property
    def dsn(self) -> str:
        """A libpq connection string for the server."""
        return f"host=127.0.0.1 port={self.port} user={self.user} dbname=postgres"

    def start(self, timeout_s: float = 60.0) -> PostgresServer:
        """initdb, start the server, wait until it accepts connections."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self._demote:
            user = pwd.getpwnam(_RUN_AS)
            os.chown(self.workdir, user.pw_uid, user.pw_gid)
        preexec = _demote if self._demote else None
        init = subprocess.run([str(self.bin / "initdb"), "-D", str(self.data), "-U", self.user, "-A", "trust",
                               "--no-sync", "-E", "UTF8"], capture_output=True, text=True, preexec_fn=preexec,
                              check=False)
        if init.returncode != 0:
            raise HarnessSetupError(f"initdb failed ({init.returncode}): {init.stderr[-2000:]}")
        with self.log_file.open("ab") as log:
            if self._demote:
                os.chown(self.log_file, pwd.getpwnam(_RUN_AS).pw_uid, -1)
            self._process = subprocess.Popen(
                [str(self.bin / "postgres"), "-D", str(self.data), "-h", "127.0.0.1", "-p", str(self.port),
                 "-k", str(self.workdir), "-c", "fsync=on", "-c", "max_connections=50"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=preexec,  # noqa: PLW1509
                start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while not self._accepts_connections():
            if self._process.poll() is not None or time.monotonic() > deadline:
                tail = self.log_file.read_text(errors="replace")[-2000:]
                self.close()
                raise HarnessSetupError(f"PostgreSQL did not start on port {self.port}:\n{tail}")
            time.sleep(0.2)
        return self

    def _accepts_connections(self) -> bool:
        ready = subprocess.run([str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                               capture_output=True, check=False)
        return ready.returncode == 0

    def close(self) -> None:
        """Stop the server (fast shutdown) and remove its folder."""
        # SIGINT, PostgreSQL's fast shutdown: SIGTERM's smart shutdown waited for every client (a connection a test
        # left open held each xdist worker's end for the 30 s stop_process allows)
        stop_process(self._process, signal.SIGINT)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def postgres_dsn() -> Iterator[str]:
    """``KAFKA2PC_POSTGRES_DSN`` when set, else the DSN of a server started for the block."""
    existing = os.environ.get(DSN_VARIABLE)
    if existing:
        yield existing
        return
    with PostgresServer() as server:
        yield server.dsn


def configure_django(dsn: str) -> None:
    """Django's settings for the libpq connection string ``dsn`` (its ``options``, a search_path, kept), then
    ``django.setup()``: once per process."""
    import django  # noqa: PLC0415 - the tests and benchmarks that use Django only
    from django.conf import settings  # noqa: PLC0415
    from psycopg.conninfo import conninfo_to_dict  # noqa: PLC0415

    parts = conninfo_to_dict(dsn)
    settings.configure(DATABASES={"default": {
        "ENGINE": "django.db.backends.postgresql", "NAME": parts.get("dbname", "postgres"),
        "USER": parts.get("user", ""), "HOST": parts.get("host", "127.0.0.1"), "PORT": parts.get("port", "5432"),
        "OPTIONS": {"options": parts["options"]} if "options" in parts else {}}}, USE_TZ=True)
    django.setup()
