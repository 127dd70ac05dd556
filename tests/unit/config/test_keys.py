"""Keys as users write them: confluent-kafka's and the Java client's names, refused keys, slips, conflicts."""

import pytest

from kafka2pc._wire.kafka_settings import kafka_python_kwargs
from kafka2pc.config import ClientConfig, ProducerConfig, keys
from kafka2pc.errors import ConfigError

SCRAM = {"bootstrap.servers": "h:1", "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
         "sasl.username": "alice", "sasl.password": "alice-secret"}


def test_librdkafka_aliases_mean_the_same_as_kafka2pc_names():
    config = ClientConfig.from_dict({"metadata.broker.list": "h:1", "security.protocol": "SASL_PLAINTEXT",
                                     "sasl.mechanisms": "PLAIN", "sasl.username": "u", "sasl.password": "p-secret",
                                     "socket.timeout.ms": "7000"})
    kwargs = kafka_python_kwargs(config)
    assert (kwargs["sasl_mechanism"], kwargs["request_timeout_ms"], kwargs["bootstrap_servers"]) == \
        ("PLAIN", 7000, ["h:1"])


def test_producer_aliases_reach_the_producer_settings():
    config = ProducerConfig.from_dict({"bootstrap.servers": "h:1", "transactional.id": "t",
                                       "queue.buffering.max.ms": "20", "compression.codec": "gzip",
                                       "message.timeout.ms": "9000", "request.required.acks": "-1",
                                       "message.max.bytes": "2000000"}, two_phase_commit=True)
    assert (config.linger_ms, config.compression_name, config.delivery_timeout_ms, config.max_request_size) == \
        (20, "gzip", 9000, 2_000_000)


def test_an_alias_and_its_key_with_different_values_is_an_error():
    with pytest.raises(ConfigError, match=r"'sasl.mechanisms'.*and sasl.mechanism name the same setting"):
        ClientConfig.from_dict({**SCRAM, "sasl.mechanisms": "PLAIN"})
    assert ClientConfig.from_dict({**SCRAM, "sasl.mechanisms": "SCRAM-SHA-512"}).options["sasl_mechanism"] == \
        "SCRAM-SHA-512"


@pytest.mark.parametrize(("key", "reason"), [
    ("key.serializer", "records reach kafka2pc as bytes"),
    ("retries", "delivery.timeout.ms"),
    ("buffer.memory", "batch.size"),
    ("ssl.cipher.suites", "OpenSSL defaults"),
    ("sasl.login.class", "oauth_cb"),
])
def test_a_key_kafka2pc_does_not_honour_says_why(key, reason):
    with pytest.raises(ConfigError, match="is not honoured") as info:
        ClientConfig.from_dict({"bootstrap.servers": "h:1", key: "x"})
    assert info.value.key == key and reason in str(info.value)


@pytest.mark.parametrize(("slip", "meant"), [
    ("sasl.mechanisim", "sasl.mechanism"),
    ("ssl.truststore.locaton", "ssl.truststore.location"),
    ("bootstrap.server", "bootstrap.servers"),
    ("sasl.jass.config", "sasl.jaas.config"),
])
def test_a_spelling_slip_names_the_nearest_key(slip, meant):
    with pytest.raises(ConfigError, match=f"unknown configuration key; did you mean '{meant}'"):
        ClientConfig.from_dict({"bootstrap.servers": "h:1", slip: "x"})


def test_an_unknown_key_far_from_any_is_just_unknown():
    with pytest.raises(ConfigError, match=r"unknown configuration key$"):
        ClientConfig.from_dict({"bootstrap.servers": "h:1", "zzz.qqq": "x"})


def test_a_producer_key_given_to_a_client_only_command_says_so():
    with pytest.raises(ConfigError, match="is a producer setting"):
        ClientConfig.from_dict({"bootstrap.servers": "h:1", "linger.ms": "5"})


@pytest.mark.parametrize(("config", "key", "fragment"), [
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}, "sasl.username", "is required"),
    ({"security.protocol": "PLAINTEXT", "ssl.ca.location": "/x"}, "ssl.ca.location", "TLS setting"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"}, "sasl.mechanism", "needs a token source"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "pppp",
      "sasl.oauthbearer.scope": "s"}, "sasl.oauthbearer.scope", "not OAUTHBEARER"),
    ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "AWS_MSK_IAM"}, "security.protocol", "SASL_SSL"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "pppp",
      "sasl.login.callback.handler.class": "com.example.Handler"}, "sasl.login.callback.handler.class",
     "Java classes cannot run"),
    ({"security.protocol": "SSL", "ssl.enabled.protocols": "TLSv1.1"}, "ssl.enabled.protocols", "TLSv1.2"),
    ({"security.protocol": "SSL", "ssl.truststore.type": "BKS"}, "ssl.truststore.type", "PKCS12, JKS, PEM"),
    ({"security.protocol": "SSL", "ssl.certificate.location": "/c.pem"}, "ssl.key.location", "private key"),
    ({"security.protocol": "SSL", "ssl.ca.location": "/a", "ssl.truststore.location": "/b"},
     "ssl.truststore.location", "give one"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc",
      "sasl.oauthbearer.client.id": "c", "sasl.oauthbearer.client.secret": "s3cret"},
     "sasl.oauthbearer.token.endpoint.url", "is required"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER", "oauth_cb": "not callable"}, "oauth_cb",
     "expected a callable"),
    # settings that would otherwise be dropped without a word (a user-level review of 2026-11-25)
    ({"sasl.username": "u", "sasl.password": "pppp"}, "sasl.username", "security.protocol is PLAINTEXT"),
    ({"security.protocol": "SSL", "sasl.password": "pppp"}, "sasl.password", "is a SASL setting"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER", "oauth_cb": print,
      "sasl.oauthbearer.method": "oidc", "sasl.oauthbearer.token.endpoint.url": "https://idp/t",
      "sasl.oauthbearer.client.id": "c", "sasl.oauthbearer.client.secret": "s3cret"}, "oauth_cb",
     "two token sources"),
    ({"security.protocol": "SSL", "ssl.key.password": "kp-1234"}, "ssl.key.password", "nothing would use it"),
    ({"security.protocol": "SSL", "ssl.truststore.password": "tp-1234"}, "ssl.truststore.password",
     "nothing would use it"),
])
def test_contradictions_and_gaps_name_the_key(config, key, fragment):
    with pytest.raises(ConfigError) as info:
        ClientConfig.from_dict({"bootstrap.servers": "h:1", **config})
    assert info.value.key == key and fragment in str(info.value)


def test_java_tls_versions_set_the_range():
    config = ClientConfig.from_dict({"bootstrap.servers": "h:1", "security.protocol": "SSL",
                                     "ssl.enabled.protocols": "TLSv1.3", "ssl.protocol": "TLSv1.3"})
    assert config.tls is not None and (config.tls.min_version, config.tls.max_version) == ("TLSv1.3", "TLSv1.3")


def test_every_key_has_a_meaning_and_aliases_are_unique():
    names = [k.name for k in keys.KEYS] + [a for k in keys.KEYS for a in k.aliases]
    assert len(names) == len(set(names))
    assert all(k.meaning for k in keys.KEYS)
    assert not set(names) & set(keys.REFUSED)


def test_the_docs_table_is_the_key_table():
    from pathlib import Path  # noqa: PLC0415

    text = (Path(__file__).parents[3] / "docs" / "configuration.md").read_text()
    assert keys.markdown_table() in text


def test_consumer_settings_in_a_providers_snippet_are_dropped_with_one_info_line(caplog, monkeypatch):
    monkeypatch.setattr(keys, "_dropped_consumer_keys", set())
    snippet = {"bootstrap.servers": "pkc-1.confluent.cloud:9092", "security.protocol": "SASL_SSL",
               "sasl.mechanisms": "PLAIN", "sasl.username": "KEY", "sasl.password": "SECRET",
               "session.timeout.ms": 45000, "linger.ms": 5}
    with caplog.at_level("INFO", logger="kafka2pc.config.keys"):
        config = ProducerConfig.from_dict({**snippet, "transactional.id": "t"}, two_phase_commit=True)
        ProducerConfig.from_dict({**snippet, "transactional.id": "u"}, two_phase_commit=True)
    assert config.linger_ms == 5
    assert [r.getMessage() for r in caplog.records] == [
        "ignoring 'session.timeout.ms': a consumer setting, and kafka2pc only writes"]
    with pytest.raises(ConfigError, match=r"did you mean 'session\.timeout\.ms'"):
        ClientConfig.from_dict({"bootstrap.servers": "h:1", "session.timeout.msec": 1})


def test_two_names_with_the_same_value_are_no_contradiction():
    base = {"bootstrap.servers": "h:1", "transactional.id": "t"}
    config = ProducerConfig.from_dict({**base, "acks": "all", "request.required.acks": -1,
                                       "delivery.timeout.ms": 120000, "message.timeout.ms": "120000",
                                       "linger.ms": 5, "queue.buffering.max.ms": "5"}, two_phase_commit=True)
    assert (config.delivery_timeout_ms, config.linger_ms) == (120_000, 5)
    with pytest.raises(ConfigError, match="different values"):
        ProducerConfig.from_dict({**base, "linger.ms": 5, "queue.buffering.max.ms": "6"}, two_phase_commit=True)
    with pytest.raises(ConfigError, match="different values"):  # text, and above all a secret, is case-sensitive
        ClientConfig.from_dict({"bootstrap.servers": "h:1", "security.protocol": "SASL_SSL",
                                "sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc",
                                "sasl.oauthbearer.token.endpoint.url": "https://idp/t",
                                "sasl.oauthbearer.client.id": "c", "sasl.oauthbearer.client.secret": "Secret-1",
                                "sasl.oauthbearer.client.credentials.client.secret": "secret-1"})


def test_a_key_only_kafka2pc_uses_inside_is_not_a_users_key():
    with pytest.raises(ConfigError, match="unknown configuration key"):
        ClientConfig.from_dict({"bootstrap.servers": "h:1", "_unsecured.sub": "alice"})


def test_the_unsecured_oauthbearer_login_works_for_a_producer():
    config = ProducerConfig.from_dict({
        "bootstrap.servers": "h:1", "transactional.id": "t", "security.protocol": "SASL_PLAINTEXT",
        "sasl.jaas.config": 'org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required '
                            'unsecuredLoginStringClaim_sub="alice";'}, two_phase_commit=True)
    assert config.client.oauth is not None and config.client.oauth.unsecured_subject == "alice"


def test_schema_registry_settings_are_dropped_like_consumer_settings(caplog):
    keys._dropped_consumer_keys.discard("basic.auth.user.info")
    with caplog.at_level("INFO", logger="kafka2pc"):
        ClientConfig.from_dict({"bootstrap.servers": "h:1", "schema.registry.url": "https://sr",
                                "basic.auth.credentials.source": "USER_INFO", "basic.auth.user.info": "k:sr-secret"})
    assert "Schema Registry" in caplog.text and "sr-secret" not in caplog.text
