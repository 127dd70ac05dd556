import pytest

from kafka2pc import TwoPhaseProducer
from kafka2pc.config import ProducerConfig
from kafka2pc.errors import ConfigError

BASE = {"bootstrap.servers": "127.0.0.1:9092", "transactional.id": "t-1"}


def test_defaults_and_overrides():
    config = ProducerConfig.from_dict({**BASE, "linger.ms": "20", "batch.size": 65536, "compression.type": "gzip",
                                       "transaction.timeout.ms": 30000, "acks": "all", "enable.idempotence": True,
                                       "client.id": "me"}, two_phase_commit=True)
    assert (config.linger_ms, config.batch_size, config.compression_name) == (20, 65536, "gzip")
    assert config.transaction_timeout_ms == 30000
    assert config.client.options["client_id"] == "me"
    assert ProducerConfig.from_dict(BASE, two_phase_commit=False).transaction_timeout_ms is None


@pytest.mark.parametrize(("extra", "key"), [
    ({"transactional.id": ""}, "transactional.id"),
    ({"transactional.id": None}, "transactional.id"),
    ({"acks": "1"}, "acks"),
    ({"enable.idempotence": "false"}, "enable.idempotence"),
    ({"enable.idempotence": "maybe"}, "enable.idempotence"),
    ({"max.in.flight.requests.per.connection": 6}, "max.in.flight.requests.per.connection"),
    ({"linger.ms": -1}, "linger.ms"),
    ({"batch.size": 0}, "batch.size"),
    ({"batch.size": 2**30}, "batch.size"),
    ({"compression.type": "brotli"}, "compression.type"),
    ({"transaction.timeout.ms": "soon"}, "transaction.timeout.ms"),
    ({"transaction.two.phase.commit.enable": "false"}, "transaction.two.phase.commit.enable"),
    ({"linger.msec": 5}, "linger.msec"),
    ({"bootstrap.servers": "nope"}, "bootstrap.servers"),
])
def test_bad_or_contradictory_key_is_named(extra, key):
    with pytest.raises(ConfigError) as info:
        ProducerConfig.from_dict({**BASE, **extra}, two_phase_commit=True)
    assert info.value.key == key


def test_missing_transactional_id():
    with pytest.raises(ConfigError, match=r"transactional\.id"):
        ProducerConfig.from_dict({"bootstrap.servers": "h:1"}, two_phase_commit=True)


def test_construction_fails_before_connecting():
    # the bad key is reported even though nothing listens at this address
    with pytest.raises(ConfigError, match="'acks'"):
        TwoPhaseProducer({**BASE, "bootstrap.servers": "127.0.0.1:1", "acks": 0}, two_phase_commit=True)
