"""A :class:`~kafka2pc.config.ClientConfig` as librdkafka (confluent-kafka) settings, for kafka2pc's independent
reader (``audit``): the same cluster, credentials and TLS material, whichever client's keys they were written in."""

from __future__ import annotations

from typing import Any

from kafka2pc.config.client import ClientConfig
from kafka2pc.config.oauth import TokenSource
from kafka2pc.config.redaction import reveal
from kafka2pc.errors import ConfigError

# kafka-python keyword -> librdkafka key (timeouts a consumer has no use for are left out)
_NAMES = {
    "client_id": "client.id", "security_protocol": "security.protocol", "sasl_mechanism": "sasl.mechanism",
    "sasl_plain_username": "sasl.username", "sasl_plain_password": "sasl.password",
    "sasl_kerberos_service_name": "sasl.kerberos.service.name", "sasl_kerberos_name": "sasl.kerberos.principal",
    "reconnect_backoff_ms": "reconnect.backoff.ms", "reconnect_backoff_max_ms": "reconnect.backoff.max.ms",
    "socket_connection_setup_timeout_ms": "socket.connection.setup.timeout.ms",
    "connections_max_idle_ms": "connections.max.idle.ms", "metadata_max_age_ms": "metadata.max.age.ms",
    "client_dns_lookup": "client.dns.lookup",
}


def librdkafka_settings(config: ClientConfig) -> dict[str, Any]:
    """librdkafka's settings for the same connection."""
    out: dict[str, Any] = {"bootstrap.servers": config.bootstrap_servers}
    for name, value in config.options.items():
        if name in _NAMES:
            out[_NAMES[name]] = str(reveal(value))
    if config.options.get("sasl_mechanism") == "AWS_MSK_IAM":
        raise ConfigError("sasl.mechanism", "AWS_MSK_IAM is not available to librdkafka, which audit reads with")
    if config.tls is not None:
        out.update(config.tls.librdkafka_config())
    if config.kerberos_keytab is not None:
        out["sasl.kerberos.keytab"] = config.kerberos_keytab
    oauth = config.oauth
    if oauth is not None:
        if oauth.source is TokenSource.OIDC:
            out.update({"sasl.oauthbearer.method": "oidc", "sasl.oauthbearer.client.id": oauth.client_id,
                        "sasl.oauthbearer.client.secret": reveal(oauth.client_secret),
                        "sasl.oauthbearer.token.endpoint.url": oauth.token_endpoint_url})
            if oauth.scope:
                out["sasl.oauthbearer.scope"] = oauth.scope
        elif oauth.source is TokenSource.CALLBACK:
            out["oauth_cb"] = oauth.callback
            if oauth.callback_config is not None:
                out["sasl.oauthbearer.config"] = oauth.callback_config
        else:
            out["enable.sasl.oauthbearer.unsecure.jwt"] = True
            out["sasl.oauthbearer.config"] = f"principal={oauth.unsecured_subject}"
        if oauth.extensions:
            out["sasl.oauthbearer.extensions"] = ",".join(f"{k}={v}" for k, v in oauth.extensions)
    return out
