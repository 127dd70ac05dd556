"""A single-node Apache Kafka in a Docker container, through testcontainers, where a Docker engine answers."""

from __future__ import annotations

import logging

from kafka2pc.testing.cluster import KafkaService
from kafka2pc.testing.local import free_ports
from kafka2pc.testing.settings import BrokerSettings

log = logging.getLogger(__name__)

IMAGE = "apache/kafka"


def docker_engine_answers() -> bool:
    """Whether testcontainers is installed and a Docker engine answers a ping."""
    try:
        import docker  # type: ignore[import-untyped]  # noqa: PLC0415 - optional, only looked up when choosing
    except ImportError:
        return False
    try:
        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


class ContainerKafka(KafkaService):
    """One ``apache/kafka:<version>`` container in KRaft mode, configured through ``KAFKA_*`` environment variables.

    Node control (kill/restart of single nodes) and multi-node clusters need the local JVM backend.
    """

    backend = "testcontainers"

    def __init__(self, settings: BrokerSettings | None = None):
        from testcontainers.core.container import DockerContainer  # noqa: PLC0415 - optional dependency

        self.settings = settings or BrokerSettings()
        self.node_ids = (1,)
        (self._port,) = free_ports(1)
        env = {
            "KAFKA_NODE_ID": "1",
            "KAFKA_PROCESS_ROLES": "broker,controller",
            "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9093",
            "KAFKA_LISTENERS": "PLAINTEXT://0.0.0.0:9092,CONTROLLER://localhost:9093",
            "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://127.0.0.1:{self._port}",
            "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
            "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "KAFKA_INTER_BROKER_LISTENER_NAME": "PLAINTEXT",
        }
        for key, value in self.settings.server_properties(1).items():
            env["KAFKA_" + key.upper().replace(".", "_")] = value
        container = DockerContainer(f"{IMAGE}:{self.settings.version}")
        container.with_bind_ports(9092, self._port)
        for key, value in env.items():
            container.with_env(key, value)
        self._container = container

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self._port}"

    def start(self, timeout_s: float = 120.0) -> ContainerKafka:
        """Start the container and wait for the broker."""
        self._container.start()
        self.wait_ready(timeout_s)
        return self

    def close(self, *, keep_logs: bool = False) -> None:
        if keep_logs:
            stdout, stderr = self._container.get_logs()
            log.warning("Kafka container logs:\n%s\n%s", stdout.decode(errors="replace")[-20000:],
                        stderr.decode(errors="replace")[-5000:])
        self._container.stop()
