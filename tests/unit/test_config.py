import pytest

from kafka2pc._wire.kafka_settings import kafka_python_kwargs
from kafka2pc.config import ClientConfig
from kafka2pc.errors import ConfigError


def test_valid_config_maps_to_kafka_python_names():
    config = ClientConfig.from_dict({
        "bootstrap.servers": "a:9092,b:9093",
        "client.id": "me",
        "security.protocol": "sasl_plaintext",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "u",
        "sasl.password": "p-secret",
        "request.timeout.ms": "5000",
    })
    assert kafka_python_kwargs(config) == {
        "bootstrap_servers": ["a:9092", "b:9093"],
        "client_id": "me",
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "u",
        "sasl_plain_password": "p-secret",
        "request_timeout_ms": 5000,
        "reconnect_backoff_ms": 50,         # Kafka's Java client's defaults, not kafka-python's (30 s at most)
        "reconnect_backoff_max_ms": 1000,
    }


def test_reconnect_backoff_keys_override_the_defaults():
    config = ClientConfig.from_dict({"bootstrap.servers": "a:1", "reconnect.backoff.max.ms": "5000"})
    assert kafka_python_kwargs(config)["reconnect_backoff_max_ms"] == 5000


@pytest.mark.parametrize(
    ("config", "key", "fragment"),
    [
        ({}, "bootstrap.servers", "is required"),
        ({"bootstrap.servers": ""}, "bootstrap.servers", "non-empty"),
        ({"bootstrap.servers": "nohost"}, "bootstrap.servers", "not host:port"),
        ({"bootstrap.servers": "h:99999"}, "bootstrap.servers", "not host:port"),
        ({"bootstrap.servers": "h:1", "linger.msx": 5}, "linger.msx", "unknown configuration key"),
        ({"bootstrap.servers": "h:1", "request.timeout.ms": -1}, "request.timeout.ms", "integer >= 1"),
        ({"bootstrap.servers": "h:1", "request.timeout.ms": True}, "request.timeout.ms", "integer >= 1"),
        ({"bootstrap.servers": "h:1", "request.timeout.ms": "x"}, "request.timeout.ms", "integer >= 1"),
        ({"bootstrap.servers": "h:1", "security.protocol": "TLS"}, "security.protocol", "expected one of"),
        ({"bootstrap.servers": "h:1", "security.protocol": "SASL_SSL"}, "sasl.mechanism", "is required"),
        ({"bootstrap.servers": "h:1", "sasl.mechanism": "PLAIN"}, "sasl.mechanism", "not SASL"),
        ({"bootstrap.servers": "h:1", "security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "x"},
         "ssl.endpoint.identification.algorithm", "https"),
    ],
)
def test_bad_config_names_the_key(config, key, fragment):
    with pytest.raises(ConfigError) as info:
        ClientConfig.from_dict(config)
    assert info.value.key == key
    assert repr(key) in str(info.value)
    assert fragment in str(info.value)


def test_keys_consumed_elsewhere_are_left_alone():
    config = ClientConfig.from_dict({"bootstrap.servers": "h:1", "linger.ms": 5}, consumed_elsewhere={"linger.ms"})
    assert config.options == {}


def test_config_error_is_a_value_error():
    with pytest.raises(ValueError, match=r"bootstrap\.servers"):
        ClientConfig.from_dict({})
