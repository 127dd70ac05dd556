"""A local OIDC token endpoint for the OAUTHBEARER listener: ``POST /token`` answers the client-credentials grant with
an RS256 JWT, and ``GET /jwks`` publishes the key the broker's validator checks it with. It records what it issued, so
tests can search their output for the tokens."""

from __future__ import annotations

import base64
import json
import secrets
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

AUDIENCE = "kafka"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _b64_int(value: int) -> str:
    return _b64(value.to_bytes((value.bit_length() + 7) // 8, "big"))


class OidcServer:
    """The token endpoint and JWKS of one test issuer, on a free loopback port, served from a daemon thread."""

    def __init__(self, client_id: str = "kafka2pc-tests") -> None:
        self.client_id = client_id
        self.client_secret = secrets.token_urlsafe(18)
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self._kid = secrets.token_hex(4)
        self._lock = threading.Lock()
        self.issued_tokens: list[str] = []
        self.refused = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, name="oidc-server", daemon=True)

    @property
    def url(self) -> str:
        """The issuer's base URL (also the ``iss`` of its tokens)."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def token_url(self) -> str:
        """The token endpoint (``sasl.oauthbearer.token.endpoint.url``)."""
        return f"{self.url}/token"

    @property
    def jwks_url(self) -> str:
        """The key set (``sasl.oauthbearer.jwks.endpoint.url`` on the broker)."""
        return f"{self.url}/jwks"

    @property
    def tokens_issued(self) -> int:
        """How many tokens were issued so far."""
        with self._lock:
            return len(self.issued_tokens)

    def start(self) -> OidcServer:
        """Serve until :meth:`close`."""
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()

    def issue_token(self, lifetime_s: float = 300.0, *, subject: str | None = None, scope: str = "kafka") -> str:
        """A signed access token for ``subject`` (the client id by default) that expires in ``lifetime_s``."""
        now = int(time.time())
        header = {"alg": "RS256", "typ": "JWT", "kid": self._kid}
        claims = {"iss": self.url, "sub": subject or self.client_id, "aud": AUDIENCE, "iat": now,
                  "exp": now + int(lifetime_s), "scope": scope, "jti": secrets.token_hex(8)}
        signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
        signature = self._key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        token = f"{signing_input}.{_b64(signature)}"
        with self._lock:
            self.issued_tokens.append(token)
        return token

    def jwks(self) -> dict[str, object]:
        """The JSON Web Key Set with the signing key."""
        numbers = self._key.public_key().public_numbers()
        return {"keys": [{"kty": "RSA", "use": "sig", "alg": "RS256", "kid": self._kid,
                          "n": _b64_int(numbers.n), "e": _b64_int(numbers.e)}]}

    def grant(self, authorization: str | None, form: dict[str, str]) -> tuple[int, dict[str, object]]:
        """Answer a token request (RFC 6749 §4.4): HTTP status and JSON body."""
        client_id, secret = form.get("client_id"), form.get("client_secret")
        if authorization and authorization.startswith("Basic "):
            decoded = base64.b64decode(authorization[6:]).decode()
            client_id, _, secret = (urllib.parse.unquote(part) for part in decoded.partition(":"))
        if form.get("grant_type") != "client_credentials":
            return 400, {"error": "unsupported_grant_type"}
        if client_id != self.client_id or not secrets.compare_digest(secret or "", self.client_secret):
            with self._lock:
                self.refused += 1
            return 401, {"error": "invalid_client"}
        lifetime = 300
        return 200, {"access_token": self.issue_token(lifetime, scope=form.get("scope", "kafka")),
                     "token_type": "Bearer", "expires_in": lifetime}


def _handler(server: OidcServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] == "/jwks":
                self._answer(200, server.jwks())
            else:
                self._answer(404, {"error": "not_found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            form = dict(urllib.parse.parse_qsl(self.rfile.read(length).decode()))
            if self.path.split("?")[0] != "/token":
                self._answer(404, {"error": "not_found"})
                return
            self._answer(*server.grant(self.headers.get("Authorization"), form))

        def _answer(self, status: int, body: dict[str, object]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass  # request lines would show nothing useful, and tests search the output for tokens

    return Handler
