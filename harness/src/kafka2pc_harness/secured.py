"""A broker with the listeners managed Kafka has, for tests of secured connections.

One single-node KRaft broker (local JVM backend) with, besides its internal PLAINTEXT listener (the harness's and the
operator tools' own):

* ``sasl_ssl`` -- SASL_SSL with PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 (user ``alice``, password ``alice-secret``);
* ``mtls`` -- SSL that requires a client certificate signed by the test CA;
* ``oauth`` -- SASL_SSL with OAUTHBEARER, tokens checked against the JWKS of a local OIDC server (:mod:`oidc`);
* ``wrong_host`` -- SSL whose certificate names ``kafka.invalid`` only, for hostname-verification tests.

Certificates are made when it starts (:mod:`certificates`). Every listener's certificate is signed by ``pki.ca_pem``.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from kafka2pc.testing.local import DEFAULT_JVM_OPTS, LocalKafkaCluster
from kafka2pc.testing.settings import BrokerSettings
from kafka2pc_harness.certificates import Pki, make_pki
from kafka2pc_harness.oidc import AUDIENCE, OidcServer

#: The SASL user of the ``sasl_ssl`` listener, for PLAIN and both SCRAM mechanisms.
USER, PASSWORD = "alice", "alice-secret"
_LISTENERS = {"SASL_SSL": "SASL_SSL", "MTLS": "SSL", "OAUTH": "SASL_SSL", "WRONGHOST": "SSL"}


def _listener_properties(pki: Pki, oidc: OidcServer) -> dict[str, str]:
    def keystore(listener: str, store: Path) -> dict[str, str]:
        prefix = f"listener.name.{listener}.ssl."
        return {prefix + "keystore.location": str(store), prefix + "keystore.type": "PKCS12",
                prefix + "keystore.password": pki.store_password, prefix + "key.password": pki.store_password}

    scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    return {
        **keystore("sasl_ssl", pki.server_p12), **keystore("mtls", pki.server_p12),
        **keystore("oauth", pki.server_p12), **keystore("wronghost", pki.wrong_host_p12),
        "listener.name.sasl_ssl.sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        "listener.name.sasl_ssl.plain.sasl.jaas.config":
            f'org.apache.kafka.common.security.plain.PlainLoginModule required user_{USER}="{PASSWORD}";',
        "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config": scram,
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": scram,
        "listener.name.mtls.ssl.client.auth": "required",
        "listener.name.mtls.ssl.truststore.location": str(pki.ca_pem),
        "listener.name.mtls.ssl.truststore.type": "PEM",
        "listener.name.oauth.sasl.enabled.mechanisms": "OAUTHBEARER",
        "listener.name.oauth.oauthbearer.sasl.jaas.config":
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;",
        "listener.name.oauth.oauthbearer.sasl.server.callback.handler.class":
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler",
        "sasl.oauthbearer.jwks.endpoint.url": oidc.jwks_url,
        "sasl.oauthbearer.expected.audience": AUDIENCE,
        "sasl.oauthbearer.expected.issuer": oidc.url,
    }


class SecuredKafka:
    """The secured broker, its PKI and its OIDC server; the ``secured_kafka`` fixture's value."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="kafka2pc-secured-"))
        self.pki = make_pki(self.directory / "pki")
        self.oidc = OidcServer().start()
        jvm_opts = (*DEFAULT_JVM_OPTS, f"-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls={self.oidc.jwks_url}")
        scram = [f"SCRAM-SHA-{bits}=[name={USER},password={PASSWORD}]" for bits in (256, 512)]
        self.service = LocalKafkaCluster(
            BrokerSettings(extra=_listener_properties(self.pki, self.oidc)), nodes=1, jvm_opts=jvm_opts,
            extra_listeners=_LISTENERS, format_args=tuple(arg for entry in scram for arg in ("--add-scram", entry)))

    def start(self) -> SecuredKafka:
        """Start the broker; on failure stop the OIDC server too."""
        try:
            self.service.start()
        except BaseException:
            self.oidc.close()
            raise
        return self

    @property
    def sasl_ssl(self) -> str:
        """Bootstrap servers of the SASL_SSL listener (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)."""
        return self.service.listener_bootstrap("SASL_SSL")

    @property
    def mtls(self) -> str:
        """Bootstrap servers of the SSL listener that requires client certificates."""
        return self.service.listener_bootstrap("MTLS")

    @property
    def oauth(self) -> str:
        """Bootstrap servers of the SASL_SSL/OAUTHBEARER listener."""
        return self.service.listener_bootstrap("OAUTH")

    @property
    def wrong_host(self) -> str:
        """Bootstrap servers of an SSL listener whose certificate names another host."""
        return self.service.listener_bootstrap("WRONGHOST")

    def close(self, *, keep_logs: bool = False) -> None:
        """Stop the broker and the OIDC server; remove the certificates."""
        self.service.close(keep_logs=keep_logs)
        self.oidc.close()
        shutil.rmtree(self.directory, ignore_errors=True)
