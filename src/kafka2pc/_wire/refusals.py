"""Connection failures that no retry will fix (credentials refused, a certificate not trusted or not naming the
host, a mechanism the listener lacks), told apart from a broker that is merely not answering.

kafka-python retries every failed bootstrap connection until its timeout, remembering only SASL failures it sees in
one place. :class:`RefusalAwareManager` remembers every failure :func:`refusal` recognises, through kafka-python's
own ``_auth_failures`` (pinned in pyproject, like the rest of this package), so the next attempt raises it and
the client fails within one connection attempt, with a message naming the cause.
"""

from __future__ import annotations

import re
import ssl
import time
from typing import Any

import kafka.errors as kafka_errors
from kafka.net.compat import KafkaNetClient
from kafka.net.manager import KafkaConnectionManager
from kafka.net.selector import NetworkSelector
from kafka.net.transport import KafkaSSLTransport, KafkaTCPTransport

from kafka2pc.config.redaction import redact
from kafka2pc.errors import AuthenticationError, ConfigError, Kafka2pcError

_ERROR_PREFIX = re.compile(r"^(\[Error \d+\] )?(\w+Error: )*")
# X509_V_ERR_HOSTNAME_MISMATCH, and X509_V_ERR_IP_ADDRESS_MISMATCH when the broker is addressed by IP
_HOST_MISMATCH = frozenset({62, 64})
_CLIENT_CERTIFICATE_REFUSED = ("CERTIFICATE_REQUIRED", "BAD_CERTIFICATE", "UNKNOWN_CA", "CERTIFICATE_UNKNOWN",
                               "ACCESS_DENIED", "HANDSHAKE_FAILURE")


def refusal(exc: BaseException, mechanism: str | None = None) -> Kafka2pcError | None:
    """The kafka2pc error for a failure no retry fixes, or None for one that may pass."""
    if isinstance(exc, AuthenticationError | ConfigError):
        return exc
    if isinstance(exc, kafka_errors.SaslAuthenticationFailedError):
        return AuthenticationError(f"the broker refused the SASL {mechanism} credentials: {_broker_words(exc)}")
    if isinstance(exc, kafka_errors.UnsupportedSaslMechanismError):
        return AuthenticationError(f"the listener does not offer SASL {mechanism}; use one of its "
                                   "sasl.enabled.mechanisms (sasl.mechanism)")
    cause = _ssl_cause(exc)
    if isinstance(cause, ssl.SSLCertVerificationError):
        if cause.verify_code in _HOST_MISMATCH:
            return AuthenticationError(f"TLS: the broker's certificate does not name the host connected to "
                                       f"({cause.verify_message}); connect by a name the certificate holds, or set "
                                       "ssl.endpoint.identification.algorithm=none")
        return AuthenticationError(f"TLS: the broker's certificate is not trusted ({cause.verify_message}); give its "
                                   "CA in ssl.ca.location, ssl.ca.pem or ssl.truststore.location")
    if isinstance(cause, ssl.SSLError):
        reason = str(cause.reason or "")
        if any(reason.endswith(alert) for alert in _CLIENT_CERTIFICATE_REFUSED):
            return AuthenticationError(f"TLS: the broker refused the client's certificate ({reason}); give one its "
                                       "truststore accepts (ssl.certificate.* or ssl.keystore.*)")
        if reason == "WRONG_VERSION_NUMBER":
            return AuthenticationError("TLS: the listener does not speak TLS; check security.protocol (SSL or "
                                       "SASL_SSL against a PLAINTEXT or SASL_PLAINTEXT listener)")
    return None


def _broker_words(exc: BaseException) -> str:
    """The broker's own message, without kafka-python's ``[Error 58] Name: Name:`` prefix."""
    return redact(_ERROR_PREFIX.sub("", str(exc))) or type(exc).__name__


def _ssl_cause(exc: BaseException) -> BaseException | None:
    """The ssl error behind kafka-python's wrapping (``Handshake failed: ...`` or a failed receive)."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, ssl.SSLError):
            return current
        pending.extend([current.__cause__, current.__context__])
        pending.extend(arg for arg in getattr(current, "args", ()) if isinstance(arg, BaseException))
    return None


class _DataBeforeClose:
    """kafka-python 3.0.12 drops the bytes of a read that also saw the peer close the socket, and a broker refusing
    credentials sends its SaslAuthenticate answer and closes at once: the answer (and its error) would be lost. These
    transports hand the bytes to the connection, and let the tasks they wake run, before reporting the close."""

    async def _read_from_sock(self: Any) -> None:
        while self._read and not self._closed:
            await self._net.wait_read(self._sock)
            received, error = self._sock_recv()
            if received:
                self.last_read = time.monotonic()
                if self._protocol and self._protocol._sensors:
                    self._protocol._sensors.bytes_received.record(len(received))
                try:
                    self._protocol.data_received(received)
                except kafka_errors.KafkaProtocolError as exc:
                    self.abort(error=exc)
                    return
            if error:
                if received:
                    # the bytes may answer a request whose task is now ready (a SaslAuthenticate refusal): let it
                    # run and fail the connection with the broker's error before the close fails it as a lost
                    # connection
                    await self._net.sleep(0)
                self.abort(error=error)
                return


class _TcpTransport(_DataBeforeClose, KafkaTCPTransport):  # type: ignore[misc]
    pass


class _SslTransport(_DataBeforeClose, KafkaSSLTransport):  # type: ignore[misc]
    pass


class RefusalAwareManager(KafkaConnectionManager):  # type: ignore[misc]
    """kafka-python's connection manager, remembering refusals as it remembers SASL failures."""

    async def _build_transport(self, node: Any, timeout_at: Any = None) -> Any:
        transport = await super()._build_transport(node, timeout_at=timeout_at)
        transport.__class__ = _SslTransport if isinstance(transport, KafkaSSLTransport) else _TcpTransport
        return transport

    async def _connect(self, node: Any, conn: Any, *args: Any, **kwargs: Any) -> None:
        # kafka-python forgets a node's remembered failure once _connect returns, and a failed initialisation
        # returns normally: remember the refusal after it
        await super()._connect(node, conn, *args, **kwargs)
        if conn.init_future.failed():
            error = refusal(conn.init_future.exception, self.config.get("sasl_mechanism"))
            if error is not None:
                self._auth_failures[node.node_id] = error


def refusal_aware_client(**configs: Any) -> Any:
    """A ``kafka_client`` for kafka-python's admin client whose manager is a :class:`RefusalAwareManager`.

    Without kafka-python's network sensors: the admin client always passes its ``Metrics``, every send and receive
    then records bytes, latency and throttle time (8 % of the Python CPU of 8 dual writers in one process, by
    docs/performance.md's profile), and nothing reads them (kafka2pc's own metrics are Prometheus ones)."""
    configs = {**configs, "metrics": None}
    net = NetworkSelector(**configs)
    return KafkaNetClient(net=net, manager=RefusalAwareManager(net, **configs), **configs)
