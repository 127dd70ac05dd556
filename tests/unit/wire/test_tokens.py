"""OAUTHBEARER token sources: kept, renewed once the refresh window has passed, failures named."""

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kafka2pc._wire.kafka_settings import kafka_python_kwargs
from kafka2pc._wire.tokens import RenewingTokens
from kafka2pc.config import ClientConfig
from kafka2pc.config.oauth import OAuthSettings, TokenSource
from kafka2pc.config.redaction import Secret
from kafka2pc.errors import AuthenticationError, ConfigError, TokenEndpointError


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_a_callback_token_is_kept_until_the_refresh_window_then_renewed():
    calls = []

    def oauth_cb(config):
        calls.append(config)
        return f"token-{len(calls)}", clock.now + 100

    clock = Clock()
    tokens = RenewingTokens(OAuthSettings(source=TokenSource.CALLBACK, callback=oauth_cb, callback_config="cfg",
                                          refresh_window=0.8), clock)
    assert tokens.token() == "token-1"
    clock.now += 79
    assert tokens.token() == "token-1"
    clock.now += 1
    assert tokens.token() == "token-2"
    assert calls == ["cfg", "cfg"]


def test_a_callback_returning_the_wrong_shape_is_named():
    tokens = RenewingTokens(OAuthSettings(source=TokenSource.CALLBACK, callback=lambda _: "just-a-token"))
    with pytest.raises(ConfigError, match=r"oauth_cb.*must return"):
        tokens.token()


def test_callback_extensions_are_sent():
    tokens = RenewingTokens(OAuthSettings(source=TokenSource.CALLBACK, extensions=(("a", "1"),),
                                          callback=lambda _: ("t", 9e9, "principal", {"b": "2"})))
    tokens.token()
    assert tokens.extensions() == {"a": "1", "b": "2"}


def test_an_unsecured_token_is_an_unsigned_jws():
    tokens = RenewingTokens(OAuthSettings(source=TokenSource.UNSECURED, unsecured_subject="alice",
                                          unsecured_lifetime_s=60), Clock())
    header, claims, signature = tokens.token().split(".")
    decode = lambda part: json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))  # noqa: E731
    assert decode(header) == {"alg": "none"} and signature == ""
    assert decode(claims) == {"sub": "alice", "iat": 1000, "exp": 1060}


class TokenEndpoint:
    """A client-credentials token endpoint on loopback (the real OIDC server is the integration tests')."""

    def __init__(self, expires_in: int = 100) -> None:
        self.requests: list[tuple[str, str]] = []
        self.status: int | None = None  # answer every request with this status instead
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"])).decode()
                endpoint.requests.append((self.headers["Authorization"], body))
                good = "Basic " + base64.b64encode(b"svc:right%20secret").decode()
                if endpoint.status is not None:
                    self._answer(endpoint.status, {"error": "slow_down"})
                elif self.headers["Authorization"] != good:
                    self._answer(401, {"error": "invalid_client", "error_description": "bad secret"})
                else:
                    self._answer(200, {"access_token": f"jwt-{len(endpoint.requests)}", "token_type": "Bearer",
                                       "expires_in": expires_in})

            def _answer(self, status: int, document: dict) -> None:
                payload = json.dumps(document).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/token"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint():
    server = TokenEndpoint()
    yield server
    server.close()


def _oidc(url: str, secret: str) -> OAuthSettings:
    return OAuthSettings(source=TokenSource.OIDC, token_endpoint_url=url, client_id="svc",
                         client_secret=Secret(secret), scope="kafka")


def test_client_credentials_are_sent_and_the_token_renewed(endpoint):
    clock = Clock()
    tokens = RenewingTokens(_oidc(endpoint.url, "right secret"), clock)
    assert tokens.token() == "jwt-1"
    assert tokens.token() == "jwt-1"
    clock.now += 81
    assert tokens.token() == "jwt-2"
    assert endpoint.requests[0][1] == "grant_type=client_credentials&scope=kafka"


def test_a_refused_client_secret_is_an_authentication_error_without_the_secret(endpoint):
    tokens = RenewingTokens(_oidc(endpoint.url, "wrong secret value"))
    with pytest.raises(AuthenticationError, match=r"refused client id 'svc': HTTP 401 .invalid_client: bad secret") \
            as info:
        tokens.token()
    assert "wrong secret value" not in str(info.value)


def test_an_unreachable_token_endpoint_is_retriable():
    tokens = RenewingTokens(_oidc("http://127.0.0.1:9/token", "right secret"))
    with pytest.raises(TokenEndpointError, match=r"no token from http://127\.0\.0\.1:9/token"):
        tokens.token()


@pytest.mark.parametrize("status", [408, 429, 500, 503])
def test_an_endpoint_that_asks_to_come_back_later_is_retriable(endpoint, status):
    endpoint.status = status
    with pytest.raises(TokenEndpointError, match=rf"answered HTTP {status} \(slow_down\)"):
        RenewingTokens(_oidc(endpoint.url, "right secret")).token()


def test_a_user_and_password_in_the_endpoint_url_are_not_shown(endpoint):
    url = endpoint.url.replace("http://", "http://svc:url-password@")
    with pytest.raises(TokenEndpointError) as info:  # urllib takes no credentials in a URL: it cannot connect
        RenewingTokens(_oidc(url, "right secret")).token()
    assert "url-password" not in str(info.value) and endpoint.url in str(info.value)


def test_clients_of_one_configuration_share_a_provider():
    settings = {"bootstrap.servers": "h:1", "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER",
                "sasl.oauthbearer.method": "oidc", "sasl.oauthbearer.client.id": "svc",
                "sasl.oauthbearer.client.secret": "s3cret", "sasl.oauthbearer.token.endpoint.url": "http://x/t"}
    first = kafka_python_kwargs(ClientConfig.from_dict(settings))["sasl_oauth_token_provider"]
    second = kafka_python_kwargs(ClientConfig.from_dict(settings))["sasl_oauth_token_provider"]
    other = kafka_python_kwargs(ClientConfig.from_dict({**settings, "sasl.oauthbearer.client.id": "other"}))
    assert first is second and other["sasl_oauth_token_provider"] is not first
