"""The verify helpers take what a user has at hand: "host:port", a client config, or the broker fixture itself."""

from __future__ import annotations

from kafka2pc.testing import BrokerSettings
from kafka2pc.testing.cluster import KafkaService
from kafka2pc.testing.verify import _connection


class Running(KafkaService):
    settings = BrokerSettings(sasl_users={"alice": "alice-secret"})
    node_ids = (0,)

    @property
    def bootstrap_servers(self) -> str:
        return "127.0.0.1:9"

    def close(self, *, keep_logs: bool = False) -> None:
        pass


def test_a_broker_fixture_connects_with_its_client_config():
    settings = _connection(Running())
    assert settings["bootstrap.servers"] == "127.0.0.1:9"
    assert settings["sasl.username"] == "admin"  # the cluster's administrator, as its client_config says
    assert _connection("127.0.0.1:9") == {"bootstrap.servers": "127.0.0.1:9"}
