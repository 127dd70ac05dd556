"""OAUTHBEARER tokens for kafka-python's connections: fetched from the configured source, kept, and renewed once a
set fraction of their lifetime has passed (every new connection and every KIP-368 re-authentication asks again)."""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from kafka.net.sasl.oauth import AbstractTokenProvider

from kafka2pc.config.oauth import OAuthSettings, TokenSource
from kafka2pc.config.redaction import redact, remember
from kafka2pc.errors import AuthenticationError, ConfigError, TokenEndpointError

log = logging.getLogger(__name__)


class RenewingTokens(AbstractTokenProvider):  # type: ignore[misc]
    """kafka-python's token provider for one client configuration."""

    def __init__(self, settings: OAuthSettings, clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self._settings = settings
        self._clock = clock
        self._lock = threading.Lock()
        self._token: str | None = None
        self._renew_at = 0.0
        self._extensions = dict(settings.extensions)
        self.fetched = 0

    def token(self) -> str:
        """The current token, fetched again once its renewal time has come."""
        with self._lock:
            now = self._clock()
            if self._token is None or now >= self._renew_at:
                token, expires_at, extensions = self._fetch(now)
                remember(token)
                lifetime = max(0.0, expires_at - now)
                self._token, self._renew_at = token, now + lifetime * self._settings.refresh_window
                self._extensions = {**dict(self._settings.extensions), **extensions}
                self.fetched += 1
                log.debug("got an OAUTHBEARER token (%s) valid for %.0f s; renewing it after %.0f s",
                          self._settings.source.value, lifetime, self._renew_at - now)
            return self._token

    def extensions(self) -> dict[str, str]:
        """SASL extensions sent with the token."""
        return dict(self._extensions)

    def _fetch(self, now: float) -> tuple[str, float, dict[str, str]]:
        source = self._settings.source
        if source is TokenSource.CALLBACK:
            return _from_callback(self._settings)
        if source is TokenSource.OIDC:
            return _from_token_endpoint(self._settings, now)
        return _unsecured(self._settings, now), now + self._settings.unsecured_lifetime_s, {}


def _from_callback(settings: OAuthSettings) -> tuple[str, float, dict[str, str]]:
    assert settings.callback is not None
    answer = settings.callback(settings.callback_config)
    if not isinstance(answer, tuple) or len(answer) not in (2, 4) or not isinstance(answer[0], str) \
            or not isinstance(answer[1], int | float):
        raise ConfigError("oauth_cb", "must return (token, expiry_epoch_seconds) or (token, expiry_epoch_seconds, "
                                      f"principal, extensions), got a {type(answer).__name__}")
    extensions = dict(answer[3] or {}) if len(answer) == 4 else {}
    return answer[0], float(answer[1]), {str(k): str(v) for k, v in extensions.items()}


def _from_token_endpoint(settings: OAuthSettings, now: float) -> tuple[str, float, dict[str, str]]:
    assert settings.token_endpoint_url and settings.client_id and settings.client_secret
    form = {"grant_type": "client_credentials"} | ({"scope": settings.scope} if settings.scope else {})
    credentials = (urllib.parse.quote(settings.client_id, safe="") + ":"
                   + urllib.parse.quote(settings.client_secret.reveal(), safe=""))
    request = urllib.request.Request(settings.token_endpoint_url, data=urllib.parse.urlencode(form).encode(),
                                     headers={"Authorization": "Basic " + base64.b64encode(credentials.encode())
                                              .decode(), "Accept": "application/json",
                                              "Content-Type": "application/x-www-form-urlencoded"})
    url = _shown(settings.token_endpoint_url)
    try:
        with urllib.request.urlopen(request, timeout=settings.request_timeout_s) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        detail = _error_detail(exc)
        if 400 <= exc.code < 500 and exc.code not in _TRY_AGAIN:
            raise AuthenticationError(f"the token endpoint {url} refused client id {settings.client_id!r}: HTTP "
                                      f"{exc.code}{detail}") from None
        raise TokenEndpointError(f"the token endpoint {url} answered HTTP {exc.code}{detail}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise TokenEndpointError(f"no token from {url}: {redact(str(getattr(exc, 'reason', exc)))}") from None
    token = body.get("access_token") if isinstance(body, dict) else None
    if not isinstance(token, str) or not token:
        raise TokenEndpointError(f"the token endpoint {url} answered without an access_token")
    expires_in = body.get("expires_in")
    expires_at = now + float(expires_in) if isinstance(expires_in, int | float) else _jwt_expiry(token, now)
    return token, expires_at, {}


#: client errors that pass with time: Request Timeout, Too Many Requests
_TRY_AGAIN = frozenset({408, 429})


def _shown(url: str) -> str:
    """``url`` without a user and password in its authority."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _error_detail(exc: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(exc.read() or b"{}")
    except ValueError:
        return ""
    if isinstance(body, dict) and body.get("error"):
        return f" ({redact(str(body['error']))}: {redact(str(body.get('error_description', '')))})".replace(": )", ")")
    return ""


def _jwt_expiry(token: str, now: float) -> float:
    """The ``exp`` claim of a JWT (not verified: the broker does that), else an hour."""
    try:
        payload = token.split(".")[1]
        claims: dict[str, Any] = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return float(claims["exp"])
    except (IndexError, KeyError, ValueError, TypeError):
        return now + 3600.0


def _unsecured(settings: OAuthSettings, now: float) -> str:
    """An unsigned JWS (``alg: none``), as Java's unsecured login module makes for test brokers."""

    def part(document: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(document).encode()).decode().rstrip("=")

    claims = {"sub": settings.unsecured_subject, "iat": int(now), "exp": int(now) + settings.unsecured_lifetime_s}
    return f"{part({'alg': 'none'})}.{part(claims)}."
