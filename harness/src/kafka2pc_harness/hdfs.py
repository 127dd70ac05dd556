"""A real HDFS for tests: Hadoop's mini cluster (a NameNode and a DataNode in one JVM, ``MiniDFSClusterManager``
from hadoop-hdfs's test jar), its jars resolved from Maven Central with ``mvn`` once, on free loopback ports.

:meth:`MiniHdfs.conf_dir` holds the ``core-site.xml``/``hdfs-site.xml`` a client needs (``fs.defaultFS``, the
NameNode's WebHDFS address): ``HADOOP_CONF_DIR`` pointing there is what Spark's JVM and kafka2pc both read.

An outage (:meth:`MiniHdfs.stop_serving`, :meth:`MiniHdfs.serve_again`) is a crash: the cluster's JVM is SIGKILLed,
then started again without ``-format`` on the same NameNode ports and data folder (the NameNode reads its image and
edit log, the DataNode its blocks), until the NameNode has a live DataNode and has left safe mode."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

from kafka2pc.testing.jars import default_cache_dir, maven_dependencies, require_tool
from kafka2pc.testing.local import free_ports
from kafka2pc_harness.proxy import LOOPBACK
from kafka2pc_harness.services import ServiceProcess

HADOOP_VERSION = "3.4.1"
_START_S = 120.0
_RESTART_S = 90.0


def hdfs_jars(version: str = HADOOP_VERSION) -> Path:
    """The folder of the mini cluster's jars, resolved with Maven into the jar cache on first use."""
    return maven_dependencies(default_cache_dir() / f"hdfs-{version}", "hdfs-pom.xml", {"hadoop.version": version},
                              what=f"Hadoop's mini HDFS cluster {version}", expect="hadoop-minicluster-*.jar",
                              runtime_only=False, package="kafka2pc_harness")


def _site(path: Path, settings: dict[str, str]) -> None:
    properties = "".join(f"<property><name>{k}</name><value>{v}</value></property>" for k, v in settings.items())
    path.write_text(f"<?xml version=\"1.0\"?><configuration>{properties}</configuration>\n")


class MiniHdfs(ServiceProcess):
    """A NameNode and a DataNode on 127.0.0.1; :attr:`url` is ``hdfs://127.0.0.1:<port>``."""

    name = "hdfs"

    def __init__(self) -> None:
        super().__init__()
        self.conf_dir = self.workdir / "conf"
        self.rpc_port, self.http_port, *self._datanode_ports = free_ports(5)
        self.url = f"hdfs://{LOOPBACK}:{self.rpc_port}"
        self._details = self.workdir / "details.json"
        #: the outages so far: (when stopped, when serving again), time.monotonic() moments
        self.outages: list[tuple[float, float]] = []
        self._stopped_at: float | None = None

    def _command(self, *, format_storage: bool) -> list[str]:
        java = require_tool("java", "to run Hadoop's mini HDFS cluster")
        jars = hdfs_jars()
        dn_data, dn_http, dn_ipc = self._datanode_ports
        binds = {"dfs.namenode.rpc-bind-host": LOOPBACK, "dfs.namenode.http-bind-host": LOOPBACK,
                 "dfs.datanode.address": f"{LOOPBACK}:{dn_data}", "dfs.datanode.http.address": f"{LOOPBACK}:{dn_http}",
                 "dfs.datanode.ipc.address": f"{LOOPBACK}:{dn_ipc}", "dfs.replication": "1",
                 "dfs.permissions.enabled": "false",
                 # a restart leaves safe mode as soon as the DataNode has reported its blocks, not 30 s later
                 "dfs.namenode.safemode.extension": "0"}
        command = [java, "-Xmx512m", "-cp", f"{jars}/*", f"-Dtest.build.data={self.workdir / 'data'}",
                   "org.apache.hadoop.test.MiniDFSClusterManager", *(["-format"] if format_storage else []),
                   "-nnport", str(self.rpc_port), "-httpport", str(self.http_port), "-writeDetails",
                   str(self._details)]
        for key, value in binds.items():
            command += ["-D", f"{key}={value}"]
        return command

    def _details_written(self) -> bool:
        return self._details.exists() and self._details.stat().st_size > 0

    def _namenode_state(self, bean: str) -> dict[str, object]:
        url = f"http://{LOOPBACK}:{self.http_port}/jmx?qry=Hadoop:service=NameNode,name={bean}"
        with urllib.request.urlopen(url, timeout=2) as answer:
            beans = json.loads(answer.read())["beans"]
        return dict(beans[0]) if beans else {}

    def serving(self) -> bool:
        """Whether the NameNode answers, has a live DataNode and is out of safe mode (it takes writes)."""
        try:
            return (self._namenode_state("NameNodeInfo").get("Safemode") == ""
                    and int(str(self._namenode_state("FSNamesystemState").get("NumLiveDataNodes", 0))) > 0)
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError, KeyError):
            return False

    def start(self) -> MiniHdfs:
        """Start the cluster and wait until it serves (its details file is written once it is up)."""
        self._launch(self._command(format_storage=True), self._details_written, timeout_s=_START_S)
        assert json.loads(self._details.read_text())["namenode_port"] == self.rpc_port
        self.conf_dir.mkdir()
        _site(self.conf_dir / "core-site.xml", {"fs.defaultFS": self.url})
        _site(self.conf_dir / "hdfs-site.xml", {"dfs.namenode.http-address": f"{LOOPBACK}:{self.http_port}"})
        return self

    def stop_serving(self) -> None:
        """Crash the cluster: SIGKILL its JVM (by pid) and wait until it is gone; the data folder stays."""
        process = self._process
        if process is None or process.poll() is not None:
            raise RuntimeError(f"the mini HDFS cluster is not running (work folder {self.workdir})")
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        self._stopped_at = time.monotonic()

    def serve_again(self) -> None:
        """Start the cluster again after :meth:`stop_serving`, without formatting, on the same NameNode ports and
        data folder; returns once the NameNode has a live DataNode and has left safe mode."""
        if self._process is not None and self._process.poll() is None:
            raise RuntimeError("the mini HDFS cluster still runs: stop_serving() first")
        self._details.unlink(missing_ok=True)
        self._launch(self._command(format_storage=False), lambda: self._details_written() and self.serving(),
                     timeout_s=_RESTART_S, append=True)
        if self._stopped_at is not None:
            self.outages.append((self._stopped_at, time.monotonic()))
            self._stopped_at = None

    def environment(self) -> dict[str, str]:
        """``HADOOP_CONF_DIR`` for clients (Spark's JVM reads it; kafka2pc finds the WebHDFS address there)."""
        return {"HADOOP_CONF_DIR": str(self.conf_dir), "HADOOP_USER_NAME": os.environ.get("USER", "root")}
