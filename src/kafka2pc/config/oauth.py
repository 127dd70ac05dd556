"""OAUTHBEARER settings: where a client's tokens come from (no I/O here: ``kafka2pc._wire.tokens`` fetches them).

Three sources, as confluent-kafka and the Java client offer them: a Python callback (confluent-kafka's ``oauth_cb``),
OIDC client credentials (``sasl.oauthbearer.method=oidc``), and an unsecured token for test brokers (the Java
``OAuthBearerLoginModule`` with ``unsecuredLoginStringClaim_sub``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import attrs

from kafka2pc.config.redaction import Secret


class TokenSource(enum.Enum):
    """Where the tokens come from."""

    CALLBACK = "callback"
    OIDC = "oidc"
    UNSECURED = "unsecured"


@attrs.frozen
class OAuthSettings:
    """Everything a client needs to get and refresh OAUTHBEARER tokens."""

    source: TokenSource
    #: confluent-kafka's ``oauth_cb(config_str) -> (token, expiry_epoch_s[, principal, extensions])``
    callback: Callable[[str | None], Any] | None = attrs.field(default=None, repr=False)
    callback_config: str | None = None
    token_endpoint_url: str | None = None
    client_id: str | None = None
    client_secret: Secret | None = None
    scope: str | None = None
    extensions: tuple[tuple[str, str], ...] = ()
    unsecured_subject: str | None = None
    unsecured_lifetime_s: int = 3600
    #: a token is renewed once this fraction of its lifetime has passed (Java's sasl.login.refresh.window.factor)
    refresh_window: float = 0.8
    #: the token endpoint's connect-and-read budget
    request_timeout_s: float = 10.0
