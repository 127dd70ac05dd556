"""Apache Kafka in KRaft mode, run from its Maven Central jars with the machine's ``java`` on loopback ports."""

from __future__ import annotations

import base64
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import IO

from kafka2pc.testing.cluster import KafkaService, wait_for_brokers
from kafka2pc.testing.errors import HarnessSetupError
from kafka2pc.testing.jars import classpath, require_tool
from kafka2pc.testing.settings import BrokerSettings

log = logging.getLogger(__name__)

DEFAULT_JVM_OPTS = ("-Xms256m", "-Xmx1g", "-XX:+UseG1GC", "-Djava.awt.headless=true")


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback TCP ports that were free a moment ago."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def new_cluster_id() -> str:
    """A random KRaft cluster id: a UUID in URL-safe base64 that, as Kafka's own ``Uuid.randomUuid`` ensures, does
    not start with '-' (the storage tool would read it as an option)."""
    while True:
        candidate = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not candidate.startswith("-"):
            return candidate


def die_with_parent() -> None:
    """A ``preexec_fn`` for JVMs the harness starts: on Linux the child gets SIGKILL when the Python process that
    started it dies, so no broker outlives a test run."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class LocalNode:
    """One combined broker+controller JVM process."""

    def __init__(self, node_id: int, port: int, controller_port: int, home: Path,
                 listener_ports: Mapping[str, int] | None = None):
        self.node_id = node_id
        self.port = port
        self.controller_port = controller_port
        self.listener_ports = dict(listener_ports or {})
        self.home = home
        self.data_dir = home / "data"
        self.logs_dir = home / "logs"
        self.properties_file = home / "server.properties"
        self.process: subprocess.Popen[bytes] | None = None
        self._stdout: IO[bytes] | None = None

    @property
    def running(self) -> bool:
        """Whether the JVM process is alive."""
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int | None:
        """The JVM's pid while it runs."""
        return self.process.pid if self.running and self.process else None

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the node's server log and stdout, for error messages."""
        parts = []
        for path in (self.logs_dir / "server.log", self.home / "stdout.log"):
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path} ---\n" + "\n".join(text))
        return "\n".join(parts)


class LocalKafkaCluster(KafkaService):
    """A KRaft cluster of ``nodes`` combined broker+controller JVMs on free loopback ports.

    >>> with LocalKafkaCluster(BrokerSettings(), nodes=1) as kafka:   # doctest: +SKIP
    ...     print(kafka.bootstrap_servers)

    ``extra_listeners`` (name -> security protocol) adds client listeners beside the one of ``settings``, each on
    its own port (:meth:`listener_bootstrap`), configured by ``listener.name.<name>.*`` keys in ``settings.extra``.
    ``format_args`` go to the storage tool's ``format`` (``--add-scram ...``).
    """

    backend = "local"

    def __init__(self, settings: BrokerSettings | None = None, *, nodes: int = 1, workdir: Path | None = None,
                 jvm_opts: tuple[str, ...] = DEFAULT_JVM_OPTS, extra_listeners: Mapping[str, str] | None = None,
                 format_args: tuple[str, ...] = ()):
        if nodes < 1:
            raise ValueError("nodes must be >= 1")
        self.settings = settings or BrokerSettings()
        self.node_ids = tuple(range(1, nodes + 1))
        self._java = require_tool("java", "to run Apache Kafka brokers (Java 17+)")
        self._classpath = classpath(self.settings.version)
        self._jvm_opts = jvm_opts
        base = Path(os.environ.get("KAFKA2PC_WORKDIR", tempfile.gettempdir()))
        base.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix=f"kafka2pc-{self.settings.version}-{nodes}n-",
                                                        dir=base))
        self._extra_listeners = dict(extra_listeners or {})
        self._format_args = format_args
        per_node = 2 + len(self._extra_listeners)
        ports = free_ports(per_node * nodes)
        self.nodes = {}
        for i, node_id in enumerate(self.node_ids):
            own = ports[per_node * i:per_node * (i + 1)]
            self.nodes[node_id] = LocalNode(node_id, own[0], own[1], self.workdir / f"node-{node_id}",
                                            dict(zip(self._extra_listeners, own[2:], strict=True)))
        self._cluster_id = new_cluster_id()
        self._log4j = resources.files(__package__).joinpath("log4j2.properties")
        self._closed = False

    # -- KafkaService --------------------------------------------------------------------------------------------

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{node.port}" for node in self.nodes.values())

    def listener_bootstrap(self, name: str) -> str:
        """``host:port[,...]`` of one of the ``extra_listeners``."""
        return ",".join(f"127.0.0.1:{node.listener_ports[name]}" for node in self.nodes.values())

    @property
    def logs_location(self) -> str:
        return str(self.workdir) + "/node-*/logs/server.log"

    @property
    def supports_node_control(self) -> bool:
        return True

    def start(self, timeout_s: float = 120.0) -> LocalKafkaCluster:
        """Format storage, start every node and wait until all brokers are registered."""
        for node in self.nodes.values():
            self._write_properties(node)
            self._format(node)
        for node in self.nodes.values():
            self._spawn(node)
        try:
            self.wait_ready(timeout_s)
        except HarnessSetupError:
            self.close(keep_logs=True)
            raise
        log.info("Kafka %s with %d node(s) ready at %s (logs: %s)", self.settings.version, len(self.nodes),
                 self.bootstrap_servers, self.logs_location)
        return self

    def stop_node(self, node_id: int) -> None:
        node = self.nodes[node_id]
        if node.process is not None and node.running:
            node.process.send_signal(signal.SIGTERM)
            try:
                node.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                log.warning("node %d did not stop within 60 s of SIGTERM; killing it", node_id)
                node.process.kill()
                node.process.wait(timeout=30)
        self._release(node)

    def kill_node(self, node_id: int) -> None:
        node = self.nodes[node_id]
        if node.process is not None and node.running:
            node.process.kill()
            node.process.wait(timeout=30)
        self._release(node)

    def start_node(self, node_id: int) -> None:
        node = self.nodes[node_id]
        if node.running:
            raise HarnessSetupError(f"node {node_id} is already running (pid {node.pid})")
        self._spawn(node)

    def restart_with(self, settings: BrokerSettings, node_ids: Sequence[int] | None = None, *,
                     timeout_s: float = 120.0) -> None:
        """Restart nodes one at a time (SIGTERM, start, ready before the next) with ``settings``: another release
        on the same log directories and cluster id (an in-place upgrade), or other server properties (two-phase
        commit turned on or off). Nodes started later (:meth:`start_node`) get ``settings`` too."""
        self.settings = settings
        self._classpath = classpath(settings.version)
        for node_id in node_ids or self.node_ids:
            self.stop_node(node_id)
            self._write_properties(self.nodes[node_id])
            self.start_node(node_id)
            self.wait_ready(timeout_s)

    def close(self, *, keep_logs: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        for node_id in self.node_ids:  # no graceful stop: the data is thrown away, and a shrinking quorum stalls it
            self.kill_node(node_id)
        if keep_logs:
            log.warning("kept Kafka broker logs in %s", self.logs_location)
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> LocalKafkaCluster:
        return self.start()

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.close(keep_logs=exc_type is not None)

    def wait_ready(self, timeout_s: float = 90.0, *, expected_brokers: int | None = None) -> None:
        """Block until every running node answers a real client call on its own port and sees the expected number
        of unfenced brokers. (Asking one node is not enough after a kill: the controller keeps the killed node's
        registration until its session times out, while the node itself is not listening yet.)"""
        running = [n for n in self.nodes.values() if n.running]
        expected = expected_brokers or len(running)
        deadline = time.monotonic() + timeout_s
        for node in running:
            config = {**self.client_config, "bootstrap.servers": f"127.0.0.1:{node.port}"}
            wait_for_brokers(config, expected, max(1.0, deadline - time.monotonic()),
                             on_timeout=self._not_ready_detail)

    def _not_ready_detail(self) -> str:
        dead = [n for n in self.nodes.values() if n.process is not None and not n.running]
        tails = "\n".join(n.log_tail() for n in dead)
        return f"broker logs: {self.logs_location}" + (f"\n{tails}" if tails else "")

    # -- internals ------------------------------------------------------------------------------------------------

    def _write_properties(self, node: LocalNode) -> None:
        node.data_dir.mkdir(parents=True, exist_ok=True)
        node.logs_dir.mkdir(parents=True, exist_ok=True)
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes.values())
        protocol = self.settings.security_protocol
        client_listeners = {protocol: (protocol, node.port)} | {
            name: (security, node.listener_ports[name]) for name, security in self._extra_listeners.items()}
        advertised = ",".join(f"{name}://127.0.0.1:{port}" for name, (_, port) in client_listeners.items())
        protocol_map = ",".join(f"{name}:{security}" for name, (security, _) in client_listeners.items())
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"{advertised},CONTROLLER://127.0.0.1:{node.controller_port}",
            "advertised.listeners": advertised,
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": f"{protocol_map},CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": protocol,
            "log.dirs": str(node.data_dir),
            **self.settings.server_properties(len(self.nodes)),
        }
        node.properties_file.write_text("".join(f"{key}={value}\n" for key, value in props.items()))

    def _java_command(self, node: LocalNode, main_class: str, *args: str) -> list[str]:
        return [
            self._java, *self._jvm_opts, "-cp", self._classpath,
            f"-Dlog4j2.configurationFile={self._log4j}", f"-Dkafka.logs.dir={node.logs_dir}",
            main_class, *args,
        ]

    def _format(self, node: LocalNode) -> None:
        cmd = self._java_command(node, "kafka.tools.StorageTool", "format", "-t", self._cluster_id,
                                 "-c", str(node.properties_file), *self._format_args)
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
        if proc.returncode != 0:
            raise HarnessSetupError(f"formatting KRaft storage of node {node.node_id} failed:\n"
                                    f"{proc.stdout}\n{proc.stderr}")

    def _spawn(self, node: LocalNode) -> None:
        node._stdout = (node.home / "stdout.log").open("ab")
        node.process = subprocess.Popen(
            self._java_command(node, "kafka.Kafka", str(node.properties_file)),
            stdout=node._stdout, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,  # noqa: PLW1509 - a tiny prctl call, before any thread exists in the child
        )
        log.info("started Kafka node %d (pid %d) on 127.0.0.1:%d", node.node_id, node.process.pid, node.port)

    @staticmethod
    def _release(node: LocalNode) -> None:
        if node._stdout is not None:
            node._stdout.close()
            node._stdout = None
