"""A :class:`~kafka2pc.config.ClientConfig` turned into kafka-python's keyword arguments: secrets revealed only
here, the SSL context built from either client's TLS keys, and one token provider per configuration and process."""

from __future__ import annotations

import os
import threading
from typing import Any

from kafka2pc._wire.tokens import RenewingTokens
from kafka2pc.config import ClientConfig
from kafka2pc.config.oauth import OAuthSettings
from kafka2pc.errors import ConfigError

#: Kafka's Java client defaults where kafka-python's differ: its reconnect backoff grows to 30 s, so a client could
#: sit out a broker's restart for longer than max.block.ms
_JAVA_DEFAULTS = {"reconnect_backoff_ms": 50, "reconnect_backoff_max_ms": 1000}
_KEYTAB_VARIABLE = "KRB5_CLIENT_KTNAME"
_providers: dict[OAuthSettings, RenewingTokens] = {}
_providers_lock = threading.Lock()


def kafka_python_kwargs(config: ClientConfig) -> dict[str, Any]:
    """Keyword arguments for kafka-python's clients."""
    kwargs: dict[str, Any] = {"bootstrap_servers": config.bootstrap_servers.split(","), **_JAVA_DEFAULTS,
                              **config.revealed_options()}
    if config.tls is not None:
        kwargs["ssl_context"] = config.tls.ssl_context()
    if config.oauth is not None:
        kwargs["sasl_oauth_token_provider"] = token_provider(config.oauth)
    if config.kerberos_keytab is not None:
        _use_keytab(config.kerberos_keytab)
    return kwargs


def token_provider(settings: OAuthSettings) -> RenewingTokens:
    """The process's token provider for ``settings`` (its clients share tokens)."""
    with _providers_lock:
        provider = _providers.get(settings)
        if provider is None:
            provider = _providers[settings] = RenewingTokens(settings)
        return provider


def _use_keytab(path: str) -> None:
    """GSS-API reads the client keytab from the environment; a different one already set is a conflict."""
    current = os.environ.get(_KEYTAB_VARIABLE)
    if current is not None and current != path:
        raise ConfigError("sasl.kerberos.keytab", f"{_KEYTAB_VARIABLE} already names another keytab in this process")
    os.environ[_KEYTAB_VARIABLE] = path
