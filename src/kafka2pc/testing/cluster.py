"""The interface every harness-provided Kafka offers, and readiness checks shared by all of them."""

from __future__ import annotations

import abc
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from kafka import errors as kafka_errors
from kafka.admin import KafkaAdminClient

from kafka2pc._wire.kafka_settings import kafka_python_kwargs
from kafka2pc.config import ClientConfig
from kafka2pc.testing.errors import HarnessSetupError, NodeControlUnsupported
from kafka2pc.testing.settings import BrokerSettings


class KafkaService(abc.ABC):
    """A running Kafka cluster provided to tests."""

    #: How the cluster was provided: "local", "testcontainers" or "external".
    backend: str = ""
    settings: BrokerSettings
    node_ids: tuple[int, ...]

    @property
    @abc.abstractmethod
    def bootstrap_servers(self) -> str:
        """``host:port[,host:port...]`` of the cluster."""

    @property
    def client_config(self) -> dict[str, object]:
        """Client settings (Kafka's dotted names) to connect as the cluster's administrator."""
        return self.settings.client_config(self.bootstrap_servers)

    @property
    def logs_location(self) -> str:
        """Where the broker logs are, for a person reading a failed test."""
        return "(not kept by the harness)"

    @property
    def supports_node_control(self) -> bool:
        """Whether single nodes can be stopped, killed and restarted."""
        return False

    def stop_node(self, node_id: int) -> None:
        """Stop one node gracefully (SIGTERM, controlled shutdown)."""
        raise NodeControlUnsupported(f"{self.backend} Kafka cannot stop single nodes")

    def kill_node(self, node_id: int) -> None:
        """Kill one node at once (SIGKILL)."""
        raise NodeControlUnsupported(f"{self.backend} Kafka cannot kill single nodes")

    def start_node(self, node_id: int) -> None:
        """Start a stopped or killed node again, with its data."""
        raise NodeControlUnsupported(f"{self.backend} Kafka cannot start single nodes")

    def restart_node(self, node_id: int, *, kill: bool = False) -> None:
        """Stop (or kill) one node and start it again."""
        if kill:
            self.kill_node(node_id)
        else:
            self.stop_node(node_id)
        self.start_node(node_id)

    @abc.abstractmethod
    def close(self, *, keep_logs: bool = False) -> None:
        """Stop the cluster; keep its logs on disk when ``keep_logs``."""

    def wait_ready(self, timeout_s: float = 90.0, *, expected_brokers: int | None = None) -> None:
        """Block until a real client sees ``expected_brokers`` unfenced brokers (default: all nodes)."""
        wait_for_brokers(self.client_config, expected_brokers or len(self.node_ids), timeout_s,
                         on_timeout=self._not_ready_detail)

    def _not_ready_detail(self) -> str:
        return f"broker logs: {self.logs_location}"


def wait_for_brokers(config: Mapping[str, object], expected: int, timeout_s: float, *,
                     on_timeout: object = None) -> None:
    """Poll DescribeCluster until ``expected`` unfenced brokers answer, or raise after ``timeout_s``."""
    bootstrap = str(config["bootstrap.servers"])
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            with _admin(config, timeout_s=min(10.0, max(1.0, deadline - time.monotonic()))) as admin:
                brokers = admin.describe_cluster()["brokers"]
            live = [b for b in brokers if not b.get("is_fenced")]
            if len(live) >= expected:
                return
            last = f"{len(live)} of {expected} brokers registered"
        except (kafka_errors.KafkaError, OSError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(0.5)
    detail = on_timeout() if callable(on_timeout) else ""
    raise HarnessSetupError(f"Kafka at {bootstrap} not ready after {timeout_s:g} s ({last}). {detail}".strip())


@contextmanager
def _admin(config: Mapping[str, object], timeout_s: float) -> Iterator[KafkaAdminClient]:
    kwargs = kafka_python_kwargs(ClientConfig.from_dict(config))
    # a short reconnect backoff: a broker still starting refuses connections, and a long backoff would wait on
    # after it has come up
    kwargs.update(reconnect_backoff_ms=50, reconnect_backoff_max_ms=250)
    admin = KafkaAdminClient(**kwargs, bootstrap_timeout_ms=int(timeout_s * 1000),
                             request_timeout_ms=int(timeout_s * 1000), client_id="kafka2pc-harness")
    try:
        yield admin
    finally:
        admin.close()
