"""Secrets stay out of reprs, messages and every log record, whoever logs them."""

import logging
import pickle

from kafka2pc.config import ClientConfig, Secret
from kafka2pc.config.redaction import redact


def test_a_secret_shows_stars_and_pickles_with_its_value():
    secret = Secret("hunter2-value")
    assert "hunter2" not in repr(secret) and "hunter2" not in str(secret) and "hunter2" not in f"{secret}"
    assert pickle.loads(pickle.dumps(secret)).reveal() == "hunter2-value"
    assert secret == Secret("hunter2-value") and hash(secret) == hash(Secret("hunter2-value"))


def test_a_client_config_repr_holds_no_password():
    config = ClientConfig.from_dict({"bootstrap.servers": "h:1", "security.protocol": "SASL_SSL",
                                     "sasl.mechanism": "PLAIN", "sasl.username": "u",
                                     "sasl.password": "pw-in-repr-1", "ssl.key.password": "key-pass-2",
                                     "ssl.key.pem": "-----BEGIN PRIVATE KEY-----abc",
                                     "ssl.certificate.pem": "-----BEGIN CERTIFICATE-----"})
    text = repr(config)
    assert "pw-in-repr-1" not in text and "key-pass-2" not in text and "PRIVATE KEY-----abc" not in text


def test_any_logger_has_remembered_secrets_scrubbed(caplog):
    Secret("pw-logged-by-a-library")
    other = logging.getLogger("some.library")
    with caplog.at_level(logging.DEBUG):
        other.debug("config %s", {"password": "pw-logged-by-a-library"})
        other.debug("bytes %r", b"user\x00pw-logged-by-a-library")
        try:
            raise ValueError("failed with pw-logged-by-a-library")
        except ValueError:
            other.exception("boom")
    text = caplog.text
    assert "pw-logged-by-a-library" not in text
    assert text.count("***") >= 3


def test_short_values_are_not_searched_for():
    Secret("ab")
    assert redact("a cab stand") == "a cab stand"


def test_spark_options_and_task_plans_show_no_secret():
    from kafka2pc.spark.options import SinkOptions  # noqa: PLC0415

    jaas = ('org.apache.kafka.common.security.scram.ScramLoginModule required username="a" '
            'password="spark-secret-77";')
    options = SinkOptions.from_options({"kafka.bootstrap.servers": "h:1", "kafka.security.protocol": "SASL_SSL",
                                        "kafka.sasl.mechanism": "SCRAM-SHA-512", "kafka.sasl.jaas.config": jaas,
                                        "kafka.ssl.truststore.location": "/tmp/ts.p12",
                                        "kafka.ssl.truststore.password": "store-pass-88",
                                        "checkpointLocation": "/tmp/kafka2pc-unit"}, streaming=False)
    assert "spark-secret-77" not in repr(options) and "store-pass-88" not in repr(options)
    # the mapping handed to tasks holds them as Secret too (its own repr is what a debugger or a log shows)
    assert "spark-secret-77" not in repr(options.producer_config) and "store-pass-88" not in repr(
        options.producer_config)
    assert options.producer_config["ssl.truststore.password"].reveal() == "store-pass-88"
    assert pickle.loads(pickle.dumps(dict(options.producer_config))) == dict(options.producer_config)


def test_two_configurations_differing_only_in_a_password_share_no_cached_client():
    from kafka2pc.sink.producer_cache import config_key  # noqa: PLC0415

    one = {"sasl.password": Secret("one-password")}
    assert config_key(one) != config_key({"sasl.password": Secret("other-password")})


def test_a_producer_repr_says_what_it_is_and_holds_no_secret():
    from kafka2pc import TwoPhaseProducer  # noqa: PLC0415
    from tests.model.coordinator import CoordinatorModel, ModelTransport  # noqa: PLC0415

    model = CoordinatorModel(transaction_version=2, two_phase_enabled=True)
    producer = TwoPhaseProducer({"bootstrap.servers": "m:1", "transactional.id": "orders-0",
                                 "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "u",
                                 "sasl.password": "hunter2-secret"}, two_phase_commit=True,
                                transport=ModelTransport(model))
    producer.init_transactions()
    shown = repr(producer)
    assert shown.startswith("<TwoPhaseProducer transactional.id='orders-0' state=READY producer=")
    assert "two_phase_commit_active=True" in shown and "hunter2" not in shown
