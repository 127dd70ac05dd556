"""An existing cluster named by ``KAFKA2PC_BOOTSTRAP``: used as it is, never started or stopped by the harness."""

from __future__ import annotations

from kafka2pc.testing.cluster import KafkaService
from kafka2pc.testing.settings import BrokerSettings


class ExternalKafka(KafkaService):
    """A cluster someone else runs. Its settings are whatever its operator chose; tests that need particular broker
    settings or node control skip on it."""

    backend = "external"

    def __init__(self, bootstrap_servers: str, settings: BrokerSettings | None = None):
        self._bootstrap = bootstrap_servers
        self.settings = settings or BrokerSettings()
        self.node_ids = ()

    @property
    def bootstrap_servers(self) -> str:
        return self._bootstrap

    def wait_ready(self, timeout_s: float = 90.0, *, expected_brokers: int | None = None) -> None:
        super().wait_ready(timeout_s, expected_brokers=expected_brokers or 1)

    def close(self, *, keep_logs: bool = False) -> None:
        """Nothing to stop: the cluster is not the harness's."""
