"""kafka2pc on secured listeners of a real broker (certificates made at test time): SASL_SSL with SCRAM-SHA-512 and
a private CA for every entry point, mTLS and OAUTHBEARER (a token callback, OIDC client credentials) for the
producer, and the refusals that must fail at once with their cause."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from kafka2pc import AuthenticationError, TransactionOutcome, TwoPhaseProducer
from kafka2pc.dualwrite import DualWriter
from kafka2pc.testing.verify import read_records, values
from tests.integration.producer_support import REPO, crash_writer

pytestmark = pytest.mark.integration
ALICE = ("alice", "alice-secret")


def scram512(secured) -> dict[str, object]:
    """confluent-kafka's keys: SCRAM-SHA-512 over TLS, the private CA as a PEM file."""
    return {"bootstrap.servers": secured.sasl_ssl, "security.protocol": "SASL_SSL",
            "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": ALICE[0], "sasl.password": ALICE[1],
            "ssl.ca.location": str(secured.pki.ca_pem)}


def scram512_java(secured) -> dict[str, object]:
    """The Java client's keys: sasl.jaas.config and a PKCS12 truststore."""
    return {"bootstrap.servers": secured.sasl_ssl, "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                                f'username="{ALICE[0]}" password="{ALICE[1]}";',
            "ssl.truststore.location": str(secured.pki.truststore_p12), "ssl.truststore.type": "PKCS12",
            "ssl.truststore.password": secured.pki.store_password}


def round_trip(config: dict[str, object], topic: str, tag: str, *, reader: dict[str, object] | None = None) -> None:
    """One transaction through TwoPhaseProducer (prepared, then committed), read back once with read_committed."""
    producer = TwoPhaseProducer({**config, "transactional.id": f"sec-{tag}-{uuid.uuid4().hex[:6]}",
                                 "max.block.ms": 30_000}, two_phase_commit=True)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        payloads = [f"{tag}-{i}".encode() for i in range(20)]
        producer.produce_batch(topic, payloads)
        state = producer.prepare_transaction()
        assert producer.complete_transaction(state) is TransactionOutcome.COMMITTED
    finally:
        producer.close()
    assert values(read_records(reader or config, topic)) == payloads


@pytest.fixture
def topic(secured_kafka, topic_factory):
    return topic_factory(secured_kafka.service)


def test_scram512_prepared_transaction_completed_by_a_second_process(secured_kafka, topic, tmp_path):
    config_file = tmp_path / "client.json"
    config_file.write_text(json.dumps({k: v for k, v in scram512(secured_kafka).items() if k != "bootstrap.servers"}))
    txn_id = f"sec-2p-{uuid.uuid4().hex[:6]}"
    report = crash_writer(secured_kafka.sasl_ssl, txn_id, topic, stage="after-prepare", count=50,
                          config_file=config_file)
    successor = TwoPhaseProducer({**scram512(secured_kafka), "transactional.id": txn_id}, two_phase_commit=True)
    try:
        assert successor.init_transactions(keep_prepared_txn=True) is not None
        assert successor.complete_transaction(report["state"]) is TransactionOutcome.COMMITTED
    finally:
        successor.close()
    assert values(read_records(scram512_java(secured_kafka), topic)) == [f"crash-{i}".encode() for i in range(50)]


def test_scram512_dual_writer(secured_kafka, topic, tmp_path):
    connection = sqlite3.connect(tmp_path / "app.db")
    connection.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
    connection.commit()
    config = {**scram512_java(secured_kafka), "transactional.id": f"sec-dw-{uuid.uuid4().hex[:6]}"}
    writer = DualWriter(connection, config)
    try:
        for order in range(5):
            with writer.transaction() as tx:
                tx.cursor.execute("INSERT INTO orders (id) VALUES (?)", (order,))
                tx.produce(topic, value=str(order).encode(), key=str(order).encode())
    finally:
        writer.close()
    assert [row[0] for row in connection.execute("SELECT id FROM orders ORDER BY id")] == [0, 1, 2, 3, 4]
    connection.close()
    assert values(read_records(scram512(secured_kafka), topic)) == [b"0", b"1", b"2", b"3", b"4"]


def test_scram512_txns_list_with_command_config(secured_kafka, topic, tmp_path):
    properties = tmp_path / "client.properties"
    java = scram512_java(secured_kafka)
    properties.write_text("".join(f"{key}={value}\n" for key, value in java.items() if key != "bootstrap.servers"))
    txn_id = f"sec-cli-{uuid.uuid4().hex[:6]}"
    crash_writer(secured_kafka.sasl_ssl, txn_id, topic, stage="after-prepare", count=5,
                 config_file=_json_file(tmp_path, scram512(secured_kafka)))
    done = subprocess.run([sys.executable, "-m", "kafka2pc.cli", "txns", "list", "--bootstrap", secured_kafka.sasl_ssl,
                           "--command-config", str(properties), "--json"], capture_output=True, text=True,
                          timeout=120, check=False, cwd=REPO)
    assert done.returncode == 0, done.stderr
    listed = {entry["transactional_id"]: entry for entry in json.loads(done.stdout)}
    assert txn_id in listed
    producer = TwoPhaseProducer({**scram512(secured_kafka), "transactional.id": txn_id}, two_phase_commit=True)
    try:  # leave nothing open behind
        producer.init_transactions()
    finally:
        producer.close()
    assert read_records(scram512(secured_kafka), topic) == []


def _json_file(directory: Path, config: dict[str, object]) -> Path:
    path = directory / f"client-{uuid.uuid4().hex[:6]}.json"
    path.write_text(json.dumps({k: v for k, v in config.items() if k != "bootstrap.servers"}))
    return path


@pytest.mark.parametrize("form", ["pem-files", "pkcs12-keystore", "jks-keystore"])
def test_mtls_round_trip(secured_kafka, topic, form):
    pki = secured_kafka.pki
    config: dict[str, object] = {"bootstrap.servers": secured_kafka.mtls, "security.protocol": "SSL"}
    if form == "pem-files":
        config |= {"ssl.ca.location": str(pki.ca_pem), "ssl.certificate.location": str(pki.client_cert_pem),
                   "ssl.key.location": str(pki.client_key_pem), "ssl.key.password": pki.key_password}
    elif form == "pkcs12-keystore":
        config |= {"ssl.truststore.location": str(pki.truststore_p12), "ssl.truststore.password": pki.store_password,
                   "ssl.keystore.location": str(pki.client_p12), "ssl.keystore.password": pki.store_password,
                   "ssl.keystore.type": "PKCS12"}
    else:
        config |= {"ssl.truststore.location": str(pki.truststore_jks), "ssl.truststore.password": pki.store_password,
                   "ssl.keystore.location": str(pki.client_jks), "ssl.keystore.password": pki.store_password,
                   "ssl.key.password": pki.store_password}
    round_trip(config, topic, f"mtls-{form}")


def test_oauthbearer_token_callback_round_trip(secured_kafka, topic):
    asked = []

    def oauth_cb(config_string):
        asked.append(config_string)
        return secured_kafka.oidc.issue_token(lifetime_s=300), time.time() + 300

    config = {"bootstrap.servers": secured_kafka.oauth, "security.protocol": "SASL_SSL",
              "sasl.mechanism": "OAUTHBEARER", "oauth_cb": oauth_cb, "sasl.oauthbearer.config": "scope=kafka",
              "ssl.ca.location": str(secured_kafka.pki.ca_pem)}
    round_trip(config, topic, "oauth-cb")
    assert asked and set(asked) == {"scope=kafka"}


def test_oauthbearer_oidc_client_credentials_round_trip(secured_kafka, topic):
    oidc = secured_kafka.oidc
    before = oidc.tokens_issued
    config = {"bootstrap.servers": secured_kafka.oauth, "security.protocol": "SASL_SSL",
              "sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc",
              "sasl.oauthbearer.token.endpoint.url": oidc.token_url, "sasl.oauthbearer.client.id": oidc.client_id,
              "sasl.oauthbearer.client.secret": oidc.client_secret, "ssl.ca.location": str(secured_kafka.pki.ca_pem)}
    round_trip(config, topic, "oauth-oidc")
    assert oidc.tokens_issued > before


# -- refusals -----------------------------------------------------------------------------------------------------

def _refused(config: dict[str, object]) -> tuple[AuthenticationError, float]:
    started = time.monotonic()
    with pytest.raises(AuthenticationError) as info:
        TwoPhaseProducer({**config, "transactional.id": "refused-0", "max.block.ms": 60_000},
                         two_phase_commit=True).init_transactions()
    return info.value, time.monotonic() - started


def test_a_wrong_password_fails_at_once_naming_the_cause(secured_kafka):
    error, took = _refused({**scram512(secured_kafka), "sasl.password": "not-the-password"})
    print(f"wrong password: {took:.2f} s: {error}")
    assert "refused the SASL SCRAM-SHA-512 credentials" in str(error) and "not-the-password" not in str(error)
    assert took < 20, "waited for the timeout instead of failing at once"


def test_an_untrusted_ca_fails_at_once_naming_the_cause(secured_kafka):
    error, took = _refused({**scram512(secured_kafka), "ssl.ca.location": str(secured_kafka.pki.other_ca_pem)})
    print(f"untrusted CA: {took:.2f} s: {error}")
    assert "certificate is not trusted" in str(error)
    assert took < 20, "waited for the timeout instead of failing at once"


def test_a_hostname_mismatch_fails_at_once_and_passes_with_verification_off(secured_kafka, topic):
    config = {"bootstrap.servers": secured_kafka.wrong_host, "security.protocol": "SSL",
              "ssl.ca.location": str(secured_kafka.pki.ca_pem)}
    error, took = _refused(config)
    print(f"hostname mismatch: {took:.2f} s: {error}")
    assert "does not name the host" in str(error)
    assert took < 20, "waited for the timeout instead of failing at once"
    round_trip({**config, "ssl.endpoint.identification.algorithm": "none"}, topic, "no-hostname-check")


def test_a_client_certificate_missing_on_an_mtls_listener_fails_at_once(secured_kafka):
    error, took = _refused({"bootstrap.servers": secured_kafka.mtls, "security.protocol": "SSL",
                            "ssl.ca.location": str(secured_kafka.pki.ca_pem)})
    print(f"no client certificate: {took:.2f} s: {error}")
    assert "refused the client's certificate" in str(error)
    assert took < 20


def test_a_mechanism_the_listener_lacks_fails_at_once(secured_kafka):
    error, took = _refused({"bootstrap.servers": secured_kafka.oauth, "security.protocol": "SASL_SSL",
                            "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": ALICE[0], "sasl.password": ALICE[1],
                            "ssl.ca.location": str(secured_kafka.pki.ca_pem)})
    print(f"mechanism not offered: {took:.2f} s: {error}")
    assert "does not offer SASL SCRAM-SHA-512" in str(error)
    assert took < 20


def _oauth_with(secured, token: str) -> dict[str, object]:
    return {"bootstrap.servers": secured.oauth, "security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
            "oauth_cb": lambda _config: (token, time.time() + 300), "ssl.ca.location": str(secured.pki.ca_pem)}


@pytest.mark.parametrize("token", ["expired", "forged"])
def test_a_rejected_token_fails_at_once(secured_kafka, token):
    issued = secured_kafka.oidc.issue_token(lifetime_s=-120 if token == "expired" else 300)
    if token == "forged":  # the claims of another subject under the real signature: the signature no longer matches
        header, _, signature = issued.split(".")
        issued = ".".join([header, secured_kafka.oidc.issue_token(subject="mallory").split(".")[1], signature])
    error, took = _refused(_oauth_with(secured_kafka, issued))
    print(f"{token} token: {took:.2f} s: {error}")
    assert "refused the SASL OAUTHBEARER credentials" in str(error) and issued not in str(error)
    assert took < 20


def test_a_wrong_client_secret_fails_at_once_naming_the_token_endpoint(secured_kafka):
    oidc = secured_kafka.oidc
    error, took = _refused({"bootstrap.servers": secured_kafka.oauth, "security.protocol": "SASL_SSL",
                            "sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc",
                            "sasl.oauthbearer.token.endpoint.url": oidc.token_url,
                            "sasl.oauthbearer.client.id": oidc.client_id,
                            "sasl.oauthbearer.client.secret": "not-the-secret",
                            "ssl.ca.location": str(secured_kafka.pki.ca_pem)})
    print(f"wrong client secret: {took:.2f} s: {error}")
    assert oidc.token_url in str(error) and "401" in str(error) and "not-the-secret" not in str(error)
    assert took < 20


def test_a_refusal_is_recognised_every_time_not_only_when_the_close_comes_later(secured_kafka):
    """The broker answers a wrong password and closes at once; when the answer and the close arrive in one read,
    the answer must still be what fails the connection (half of the attempts were missed before)."""
    config = {**scram512(secured_kafka), "sasl.password": "not-the-password"}
    for attempt in range(10):
        _, took = _refused(config)
        assert took < 3, f"attempt {attempt}: the refusal was missed and retried ({took:.1f} s)"
