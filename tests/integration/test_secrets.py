"""No password, client secret, key passphrase, store password or token in anything kafka2pc prints or logs at DEBUG:
the producer (SCRAM, OIDC, mTLS), a refused login, the dual writer, the cluster client, a Spark batch write (driver
and Python workers), and every CLI command with -v. The search is shown to find a secret once scrubbing is off."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.integration.producer_support import REPO

pytestmark = pytest.mark.integration
JOB = Path(__file__).with_name("secrets_job.py")
PASSWORD = "alice-secret"


def _plan(secured, topic: str) -> dict:
    pki, oidc = secured.pki, secured.oidc
    tls = {"ssl.truststore.location": str(pki.truststore_p12), "ssl.truststore.password": pki.store_password}
    java = {"bootstrap.servers": secured.sasl_ssl, "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                                f'username="alice" password="{PASSWORD}";', **tls}
    return {
        "topic": topic,
        "java": java,
        "producers": {
            "scram": {"bootstrap.servers": secured.sasl_ssl, "security.protocol": "SASL_SSL",
                      "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "alice", "sasl.password": PASSWORD, **tls},
            "oidc": {"bootstrap.servers": secured.oauth, "security.protocol": "SASL_SSL",
                     "sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc",
                     "sasl.oauthbearer.token.endpoint.url": oidc.token_url,
                     "sasl.oauthbearer.client.id": oidc.client_id,
                     "sasl.oauthbearer.client.secret": oidc.client_secret, **tls},
            "mtls": {"bootstrap.servers": secured.mtls, "security.protocol": "SSL", **tls,
                     "ssl.certificate.location": str(pki.client_cert_pem),
                     "ssl.key.location": str(pki.client_key_pem), "ssl.key.password": pki.key_password},
        },
        "refused": {"wrong password": {**java, "sasl.jaas.config": java["sasl.jaas.config"].replace(
            PASSWORD, "wrong-password-42"), "max.block.ms": 20_000}},
    }


def _secrets(secured) -> set[str]:
    return {PASSWORD, "wrong-password-42", secured.pki.store_password, secured.pki.key_password,
            secured.oidc.client_secret, *secured.oidc.issued_tokens}


def _run_everything(secured, topic: str, tmp_path: Path, *extra: str) -> str:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(_plan(secured, topic)))
    job = subprocess.run([sys.executable, str(JOB), str(plan), *extra], capture_output=True, text=True, timeout=300,
                         check=False, cwd=REPO, env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert job.returncode == 0, job.stderr[-3000:]
    output = job.stdout + job.stderr
    properties = tmp_path / "client.properties"
    properties.write_text("".join(f"{k}={v}\n" for k, v in _plan(secured, topic)["java"].items()
                                  if k != "bootstrap.servers"))
    connection = ["--bootstrap", secured.sasl_ssl, "--command-config", str(properties)]
    for command in (["doctor"], ["txns", "list"], ["audit", "--topic", topic, "--id-field", "id", "--settle", "0"],
                    ["recover", "--log-dir", str(tmp_path / "no-log"), "--prefix", "secrets-none"]):
        done = subprocess.run([sys.executable, "-m", "kafka2pc.cli", "-v", *command, *connection],
                              capture_output=True, text=True, timeout=120, check=False, cwd=REPO)
        output += f"\n=== kafka2pc {' '.join(command)} (exit {done.returncode})\n{done.stdout}{done.stderr}"
    return output


def _masked(output: str, secrets: set[str]) -> str:
    for number, secret in enumerate(sorted(secrets)):
        output = output.replace(secret, f"<SECRET-{number}>")
    return output


def _where(output: str, secrets: set[str]) -> list[str]:
    """The lines that hold a secret, the secrets masked."""
    return [_masked(line, secrets)[:300] for line in output.splitlines() if any(s and s in line for s in secrets)][:5]


def _found(output: str, secrets: set[str]) -> list[str]:
    return sorted(secret for secret in secrets if secret and secret in output)


def test_no_secret_in_anything_printed_or_logged_at_debug(secured_kafka, topic_factory, tmp_path):
    output = _run_everything(secured_kafka, topic_factory(secured_kafka.service), tmp_path)
    secrets = _secrets(secured_kafka)
    assert len(secured_kafka.oidc.issued_tokens) >= 1  # tokens were fetched, so they are among what is searched
    # the output is the real thing: kafka-python's DEBUG lines, its SASL requests, Spark's worker logs, each command
    kept = Path(tempfile.mkdtemp(prefix="kafka2pc-secrets-")) / "output.txt"
    kept.write_text(_masked(output, secrets))  # kept for a failure's reader, with any secret found masked
    for evidence in ("SaslAuthenticateRequest", "Starting KafkaAdminClient with configuration", "spark: written",
                     "=== kafka2pc doctor", "=== kafka2pc recover", "refused the SASL SCRAM-SHA-512 credentials"):
        assert evidence in output, f"{evidence!r} not in the output ({kept})"
    assert _found(output, secrets) == [], f"secrets in the output: {_where(output, secrets)} ({kept})"
    shutil.rmtree(kept.parent)
    print(f"searched {len(output):,} characters of output for {len(secrets)} secrets: none found")


# the control of the search above (it finds a password once scrubbing is off), 25-36 s: make chaos runs it
# (-m slow), out of the default suite's time budget
@pytest.mark.slow
def test_the_search_finds_a_password_once_scrubbing_is_off(secured_kafka, topic_factory, tmp_path):
    output = _run_everything(secured_kafka, topic_factory(secured_kafka.service), tmp_path, "--leak")
    assert PASSWORD in _found(output, _secrets(secured_kafka))
