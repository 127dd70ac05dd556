"""A Spark standalone cluster on loopback, run from pip's pyspark (``pyspark/bin/spark-class``), and the Linux process
helpers the Spark kill tests use: find a process tree in ``/proc``, freeze it, SIGKILL it, wait until it is gone.

Each JVM is a child of this Python process (no ``spark-daemon.sh``, which daemonizes), so its pid is known and it gets
SIGKILL if the starting thread dies (``PR_SET_PDEATHSIG``). An executor JVM is a child of its Worker JVM and exits
when the Worker goes; pyspark's Python daemon under an executor exits when the executor closes its stdin.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

import attrs

from kafka2pc.testing.errors import HarnessSetupError
from kafka2pc.testing.jars import require_tool
from kafka2pc.testing.local import die_with_parent, free_ports

log = logging.getLogger(__name__)

EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
LOOPBACK = "127.0.0.1"


def worker_host(index: int) -> str:
    """Worker ``index``'s own loopback address (127.0.0.2, 127.0.0.3, ...): Spark launches a speculative copy of a
    task only on another host than the running attempt's, so workers sharing one address would never speculate."""
    return f"127.0.0.{2 + index}"


# -- processes (Linux /proc) -------------------------------------------------------------------------------------


@attrs.frozen
class ProcInfo:
    """One process as ``/proc`` showed it."""

    pid: int
    ppid: int
    pgid: int
    state: str
    #: clock ticks since boot: with the pid, it names the process even after the pid is reused
    start_time: int
    cmdline: tuple[str, ...]
    #: CPU seconds (user + system) it has used, with those of the children it has reaped
    cpu_s: float = 0.0

    @property
    def zombie(self) -> bool:
        """Dead, waiting to be reaped (no parent reaps it when the parent died: PID 1 may not reap)."""
        return self.state in ("Z", "X")


def proc_info(pid: int) -> ProcInfo | None:
    """The process ``pid``, or None when there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # the command name in parentheses may hold spaces
    cmdline = tuple(part.decode(errors="replace") for part in raw.split(b"\0") if part)
    return ProcInfo(pid=pid, ppid=int(fields[1]), pgid=int(fields[2]), state=fields[0], start_time=int(fields[19]),
                    cmdline=cmdline, cpu_s=sum(map(int, fields[11:15])) / os.sysconf("SC_CLK_TCK"))


def process_table() -> dict[int, ProcInfo]:
    """Every live (non-zombie) process of the machine by pid."""
    if not Path("/proc/self/stat").exists():
        raise HarnessSetupError("the Spark process helpers need Linux's /proc")
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            info = proc_info(int(entry))
            if info is not None and not info.zombie:
                table[info.pid] = info
    return table


def descendants(pid: int, table: Mapping[int, ProcInfo] | None = None) -> list[int]:
    """The pids of every live process below ``pid`` (children, their children, ...), parents before children."""
    procs = table if table is not None else process_table()
    children: dict[int, list[int]] = {}
    for info in procs.values():
        children.setdefault(info.ppid, []).append(info.pid)
    found: list[int] = []
    frontier = [pid]
    while frontier:  # bounded: each pid of the finite table is visited once (ppid links form a tree)
        nxt = [child for parent in frontier for child in sorted(children.get(parent, ()))]
        found.extend(nxt)
        frontier = nxt
    return found


def alive(pid: int, start_time: int | None = None) -> bool:
    """Whether ``pid`` is a live process (the same one, when its ``start_time`` is given)."""
    info = proc_info(pid)
    return info is not None and not info.zombie and (start_time is None or info.start_time == start_time)


def kill_processes(pids: Iterable[int], *, include_descendants: bool = True, timeout_s: float = 30.0) -> list[int]:
    """SIGKILL ``pids`` (and every process below them) at once and wait until they are gone; returns the pids
    killed. The tree is frozen with SIGSTOP first, so no process forks a child that escapes the kill."""
    targets: dict[int, int] = {}  # pid -> start time
    pending = list(pids)
    for _ in range(8):  # freeze rounds: a process may fork between a scan and its SIGSTOP
        for pid in pending:
            info = proc_info(pid)
            if info is None or info.zombie or pid in targets or pid == os.getpid():
                continue
            targets[pid] = info.start_time
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        if not include_descendants:
            break
        table = process_table()
        pending = [d for pid in targets for d in descendants(pid, table) if d not in targets]
        if not pending:
            break
    for pid in targets:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    wait_gone(targets, timeout_s)
    return sorted(targets)


def wait_gone(procs: Mapping[int, int | None] | Iterable[int], timeout_s: float) -> None:
    """Block until no process of ``procs`` (pids, or pid -> start time) is alive; HarnessSetupError after
    ``timeout_s``."""
    starts: dict[int, int | None] = dict(procs) if isinstance(procs, Mapping) else dict.fromkeys(procs)
    deadline = time.monotonic() + timeout_s
    while True:
        left = [pid for pid, start in starts.items() if alive(pid, start)]
        if not left:
            return
        if time.monotonic() > deadline:
            raise HarnessSetupError(f"processes {left} still alive {timeout_s:g} s after SIGKILL")
        time.sleep(0.05)


# -- the standalone cluster --------------------------------------------------------------------------------------


def pyspark_home() -> Path:
    """The installed pyspark package folder, which pip's pyspark uses as ``SPARK_HOME``."""
    try:
        import pyspark  # noqa: PLC0415 - the spark extra is optional
    except ImportError as exc:
        raise HarnessSetupError("pyspark is not installed: pip install 'kafka2pc[spark]'") from exc
    return Path(pyspark.__file__).parent


@attrs.frozen
class SparkWorkerInfo:
    """One Worker JVM of a :class:`StandaloneSparkCluster`."""

    index: int
    pid: int
    port: int
    webui_port: int
    #: where the Worker puts each executor's folder (``<app id>/<executor id>/stdout|stderr``)
    work_dir: Path


class _Daemon:
    """One Master or Worker JVM started with ``spark-class``."""

    def __init__(self, name: str, args: list[str], log_file: Path):
        self.name = name
        self.args = args
        self.log_file = log_file
        self.process: subprocess.Popen[bytes] | None = None
        self._out: IO[bytes] | None = None

    def spawn(self, env: Mapping[str, str]) -> None:
        self._out = self.log_file.open("ab")
        self.process = subprocess.Popen(
            self.args, env=dict(env), stdout=self._out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C in the terminal reaches pytest, which then closes the cluster
            preexec_fn=die_with_parent,  # noqa: PLW1509 - a tiny prctl call, before any thread exists in the child
        )

    @property
    def pid(self) -> int:
        assert self.process is not None, f"{self.name} was started"
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def release(self) -> None:
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)
        if self._out is not None:
            self._out.close()
            self._out = None

    def log_tail(self, lines: int = 25) -> str:
        if not self.log_file.exists():
            return ""
        text = self.log_file.read_text(errors="replace").splitlines()[-lines:]
        return f"--- {self.log_file} ---\n" + "\n".join(text)


class StandaloneSparkCluster:
    """A Spark standalone Master and ``workers`` Workers on free loopback ports, in a temporary folder.

    >>> with StandaloneSparkCluster() as spark_cluster:   # doctest: +SKIP
    ...     session = new_session(spark_cluster.master_url, "app", conf=spark_cluster.driver_conf())
    """

    def __init__(self, *, workers: int = 2, cores_per_worker: int = 1, worker_memory: str = "1g",
                 executor_memory: str = "512m", daemon_memory: str = "256m", workdir: Path | None = None):
        if workers < 1 or cores_per_worker < 1:
            raise ValueError("workers and cores_per_worker must be >= 1")
        require_tool("java", "to run Spark's Master and Worker JVMs (Java 17+)")
        self.home = pyspark_home()
        self._spark_class = self.home / "bin" / "spark-class"
        if not self._spark_class.exists():
            raise HarnessSetupError(f"{self._spark_class} is missing: pyspark's launcher scripts are needed")
        self.cores_per_worker = cores_per_worker
        self.executor_memory = executor_memory
        base = Path(os.environ.get("KAFKA2PC_WORKDIR", tempfile.gettempdir()))
        base.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="kafka2pc-spark-standalone-", dir=base))
        self._daemon_memory = daemon_memory
        ports = free_ports(2 + 2 * workers)
        self.master_port, self.master_webui_port = ports[0], ports[1]
        self.master_url = f"spark://{LOOPBACK}:{self.master_port}"
        self.master_webui_url = f"http://{LOOPBACK}:{self.master_webui_port}"
        logs = self.workdir / "logs"
        self._master = _Daemon("master", [
            "bash", str(self._spark_class), MASTER_CLASS, "--host", LOOPBACK, "--port", str(self.master_port),
            "--webui-port", str(self.master_webui_port),
        ], logs / "master.out")
        self._workers: list[tuple[_Daemon, int, int, Path]] = []
        for i in range(workers):
            port, webui_port = ports[2 + 2 * i], ports[3 + 2 * i]
            work_dir = self.workdir / f"worker-{i}"
            daemon = _Daemon(f"worker-{i}", [
                "bash", str(self._spark_class), WORKER_CLASS, "--host", worker_host(i), "--port", str(port),
                "--webui-port", str(webui_port), "--cores", str(cores_per_worker), "--memory", worker_memory,
                "--work-dir", str(work_dir), self.master_url,
            ], logs / f"worker-{i}.out")
            self._workers.append((daemon, port, webui_port, work_dir))
        self._started = False
        self._closed = False

    # -- life cycle ------------------------------------------------------------------------------------------------

    def start(self, timeout_s: float = 90.0) -> StandaloneSparkCluster:
        """Start the Master, then the Workers, and wait until every Worker is ALIVE at the Master."""
        if self._started:
            raise HarnessSetupError("the cluster was started already")
        self._started = True
        conf_dir = self.workdir / "conf"  # empty: no spark-env.sh or spark-defaults.conf of the machine is read
        for folder in (conf_dir, self.workdir / "logs", *(w[3] for w in self._workers)):
            folder.mkdir(parents=True, exist_ok=True)
        env = self._env(conf_dir)
        try:
            self._master.spawn(env)
            for i, (daemon, *_) in enumerate(self._workers):
                # executors inherit their Worker's address, for binding and for the host Spark schedules by
                daemon.spawn({**env, "SPARK_LOCAL_IP": worker_host(i), "SPARK_LOCAL_HOSTNAME": worker_host(i)})
            self.wait_ready(timeout_s, alive_workers=len(self._workers))
        except BaseException:
            self.close(keep_logs=True)
            raise
        log.info("Spark standalone cluster ready at %s (web UI %s, logs %s)", self.master_url, self.master_webui_url,
                 self.workdir / "logs")
        return self

    def wait_ready(self, timeout_s: float = 90.0, *, alive_workers: int | None = None) -> None:
        """Poll the Master's JSON UI until ``alive_workers`` (default: every running Worker) are ALIVE."""
        deadline = time.monotonic() + timeout_s
        seen: object = None
        while True:
            expected = alive_workers if alive_workers is not None else len(self._live_workers())
            if not self._master.running:
                problem = "the Master exited"
            elif len(self._live_workers()) < expected:
                problem = "a Worker exited"
            else:
                with contextlib.suppress(OSError, ValueError):
                    seen = [w.get("state") for w in self.master_state().get("workers", [])]
                    if isinstance(seen, list) and seen.count("ALIVE") >= expected:
                        return
                if time.monotonic() < deadline:
                    time.sleep(0.5)
                    continue
                problem = f"fewer than {expected} ALIVE worker(s) after {timeout_s:g} s (workers: {seen})"
            raise HarnessSetupError(f"the Spark standalone cluster at {self.master_url}: {problem}\n{self.log_tail()}")

    def close(self, *, keep_logs: bool = False) -> None:
        """SIGKILL every Worker with its executors and their Python workers, then the Master; remove the folder."""
        if self._closed:
            return
        self._closed = True
        roots = [d.pid for d, *_ in self._workers if d.process is not None]
        if self._master.process is not None:
            roots.append(self._master.pid)
        try:
            kill_processes(roots)
        finally:
            for daemon, *_ in self._workers:
                daemon.release()
            self._master.release()
        if keep_logs:
            log.warning("kept the Spark standalone cluster's logs in %s", self.workdir)
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> StandaloneSparkCluster:
        return self.start()

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.close(keep_logs=exc_type is not None)

    # -- what runs -----------------------------------------------------------------------------------------------

    @property
    def master_pid(self) -> int:
        """The Master JVM's pid."""
        return self._master.pid

    @property
    def workers(self) -> list[SparkWorkerInfo]:
        """The Worker JVMs, running or killed."""
        return [SparkWorkerInfo(index=i, pid=d.pid, port=port, webui_port=ui, work_dir=wd)
                for i, (d, port, ui, wd) in enumerate(self._workers)]

    def master_state(self) -> dict[str, Any]:
        """The Master's ``/json`` document: workers, applications, their states."""
        with urllib.request.urlopen(f"{self.master_webui_url}/json/", timeout=5) as response:
            state: dict[str, Any] = json.loads(response.read())
        return state

    def driver_conf(self) -> dict[str, str]:
        """Spark settings for a driver of this cluster: one core per executor, and no task starts before every
        Worker has an executor (so a test knows where its tasks run)."""
        return {
            "spark.master": self.master_url,
            "spark.executor.cores": str(self.cores_per_worker),
            "spark.executor.memory": self.executor_memory,
            "spark.cores.max": str(self.cores_per_worker * len(self._workers)),
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": "60s",
            "spark.driver.host": LOOPBACK,
            "spark.driver.bindAddress": LOOPBACK,
        }

    def executor_pids(self, app_id: str | None = None) -> list[int]:
        """The executor JVMs (``CoarseGrainedExecutorBackend`` children of this cluster's Workers), of one
        application when ``app_id`` is given."""
        workers = {d.pid for d, *_ in self._workers if d.running}
        found = []
        for info in process_table().values():
            if info.ppid not in workers or EXECUTOR_CLASS not in info.cmdline:
                continue
            if app_id is not None and _arg(info.cmdline, "--app-id") != app_id:
                continue
            found.append(info.pid)
        return sorted(found)

    def python_worker_pids(self, executor_pid: int) -> list[int]:
        """pyspark's daemon and the Python workers it forked, below one executor JVM."""
        return descendants(executor_pid)

    def kill_executor(self, pid: int, *, timeout_s: float = 30.0) -> list[int]:
        """SIGKILL one executor JVM and its Python workers at once, as a machine crash would; returns the pids
        killed. The Worker sees the executor exit and the Master starts a replacement."""
        if pid not in self.executor_pids():
            raise ValueError(f"{pid} is not an executor of this cluster (executors: {self.executor_pids()})")
        return kill_processes([pid], timeout_s=timeout_s)

    def kill_worker(self, index: int, *, timeout_s: float = 30.0) -> list[int]:
        """SIGKILL one Worker JVM with its executors and their Python workers; returns the pids killed."""
        daemon = self._workers[index][0]
        if not daemon.running:
            raise ValueError(f"worker {index} is not running")
        killed = kill_processes([daemon.pid], timeout_s=timeout_s)
        daemon.release()
        return killed

    def all_pids(self) -> list[int]:
        """Every live process of the cluster: Master, Workers, executors, Python workers."""
        table = process_table()
        roots = [d.pid for d in (self._master, *(w[0] for w in self._workers)) if d.running]
        return sorted({*roots, *(p for root in roots for p in descendants(root, table))})

    def log_tail(self, lines: int = 25) -> str:
        """The last lines of the Master's and Workers' logs, for error messages."""
        return "\n".join(d.log_tail(lines) for d in (self._master, *(w[0] for w in self._workers)))

    # -- internals -----------------------------------------------------------------------------------------------

    def _live_workers(self) -> list[_Daemon]:
        return [d for d, *_ in self._workers if d.running]

    def _env(self, conf_dir: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPARK_")}
        env.update({
            "SPARK_HOME": str(self.home),
            "SPARK_CONF_DIR": str(conf_dir),
            "SPARK_LOG_DIR": str(self.workdir / "logs"),
            "SPARK_PID_DIR": str(self.workdir),
            "SPARK_LOCAL_IP": LOOPBACK,
            "SPARK_LOCAL_HOSTNAME": LOOPBACK,
            "SPARK_DAEMON_MEMORY": self._daemon_memory,
            "SPARK_DAEMON_JAVA_OPTS": "-Djava.awt.headless=true -Dspark.master.rest.enabled=false",
            # executors inherit the Worker's environment; their Python workers run the driver's interpreter
            "PYSPARK_PYTHON": sys.executable,
        })
        return env


def _arg(cmdline: tuple[str, ...], flag: str) -> str | None:
    with contextlib.suppress(ValueError, IndexError):
        return cmdline[cmdline.index(flag) + 1]
    return None


__all__ = [
    "ProcInfo",
    "SparkWorkerInfo",
    "StandaloneSparkCluster",
    "alive",
    "descendants",
    "kill_processes",
    "proc_info",
    "process_table",
    "pyspark_home",
    "wait_gone",
]
