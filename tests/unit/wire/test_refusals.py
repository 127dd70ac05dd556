"""Which connection failures no retry fixes, and what they are called."""

import ssl

import kafka.errors as kafka_errors
import pytest
from kafka.metrics import Metrics
from kafka.net.connection import KafkaConnection

from kafka2pc._wire.refusals import refusal, refusal_aware_client
from kafka2pc.errors import AuthenticationError


def _verify_error(code: int, message: str) -> ssl.SSLCertVerificationError:
    error = ssl.SSLCertVerificationError(1, message)
    error.verify_code, error.verify_message = code, message
    return error


def _wrapped(cause: BaseException) -> Exception:
    """As kafka-python raises it: 'Handshake failed: ...' with the ssl error as its context."""
    try:
        try:
            raise cause
        except Exception as exc:
            raise kafka_errors.KafkaConnectionError(f"Handshake failed: {exc}") from None
    except kafka_errors.KafkaConnectionError as outer:
        outer.__context__ = cause
        return outer


def _alert(reason: str) -> ssl.SSLError:
    error = ssl.SSLError(1, f"[SSL: {reason}] alert")
    error.reason = reason
    return error


@pytest.mark.parametrize(("failure", "fragment"), [
    (kafka_errors.SaslAuthenticationFailedError("SaslAuthenticationFailedError: Authentication failed: Invalid "
                                                "username or password"),
     "refused the SASL PLAIN credentials: Authentication failed: Invalid username or password"),
    (kafka_errors.UnsupportedSaslMechanismError(), "does not offer SASL PLAIN"),
    (_wrapped(_verify_error(62, "Hostname mismatch, certificate is not valid for 'broker.example'.")),
     "does not name the host"),
    (_wrapped(_verify_error(64, "IP address mismatch, certificate is not valid for '127.0.0.1'.")),
     "does not name the host"),
    (_wrapped(_verify_error(20, "unable to get local issuer certificate")), "is not trusted"),
    (kafka_errors.KafkaConnectionError(_alert("TLSV13_ALERT_CERTIFICATE_REQUIRED")),
     "refused the client's certificate"),
    (_wrapped(_alert("WRONG_VERSION_NUMBER")), "does not speak TLS"),
])
def test_refusals_are_named(failure, fragment):
    error = refusal(failure, "PLAIN")
    assert isinstance(error, AuthenticationError) and fragment in str(error)


@pytest.mark.parametrize("failure", [
    kafka_errors.KafkaConnectionError("111 ECONNREFUSED"),
    kafka_errors.KafkaConnectionError("socket disconnected"),
    kafka_errors.KafkaTimeoutError(),
    _wrapped(_alert("SOME_OTHER_REASON")),
])
def test_failures_that_may_pass_are_not_refusals(failure):
    assert refusal(failure, "PLAIN") is None


def test_the_network_client_records_no_sensors_nobody_reads() -> None:
    """kafka-python's admin client always hands its Metrics to the network client: the connections would record
    bytes, latency and throttle time per send and receive (8 % of the Python CPU of 8 dual writers,
    docs/performance.md). kafka2pc reads none of it."""
    client = refusal_aware_client(bootstrap_servers="127.0.0.1:1", client_id="sensors", metrics=Metrics(),
                                  metric_group_prefix="admin")
    try:
        connection = KafkaConnection(client._manager._net, node_id=0,
                                     broker_version_data=client._manager.broker_version_data, **client._manager.config)
        assert connection._sensors is None
    finally:
        client.close()
