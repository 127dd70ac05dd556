"""The one classification of Kafka's error codes."""

import kafka.errors as kafka_errors
import pytest

from kafka2pc._core import codes


@pytest.mark.parametrize(("code", "kind"), [
    (codes.NONE, codes.Kind.DONE),
    (codes.DUPLICATE_SEQUENCE_NUMBER, codes.Kind.DONE),
    (codes.NOT_COORDINATOR, codes.Kind.COORDINATOR_BUSY),
    (codes.CONCURRENT_TRANSACTIONS, codes.Kind.COORDINATOR_BUSY),
    (kafka_errors.NotLeaderForPartitionError.errno, codes.Kind.PARTITION_BUSY),
    (codes.UNKNOWN_TOPIC_OR_PARTITION, codes.Kind.PARTITION_BUSY),
    (codes.PRODUCER_FENCED, codes.Kind.FENCED),
    (codes.INVALID_PRODUCER_EPOCH, codes.Kind.FENCED),
    (codes.INVALID_TXN_STATE, codes.Kind.STALE),
    (codes.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, codes.Kind.UNAUTHORIZED),
    (codes.TOPIC_AUTHORIZATION_FAILED, codes.Kind.OTHER),  # a write to that topic fails; the transaction aborts
    (codes.MESSAGE_TOO_LARGE, codes.Kind.TOO_LARGE),
    (codes.UNSUPPORTED_VERSION, codes.Kind.UNSUPPORTED),
    (-1, codes.Kind.OTHER),
])
def test_kinds(code, kind):
    assert codes.kind(code) is kind


def test_coordinator_retriable_is_derived_from_the_kinds():
    busy = {codes.COORDINATOR_LOAD_IN_PROGRESS, codes.COORDINATOR_NOT_AVAILABLE, codes.NOT_COORDINATOR,
            codes.CONCURRENT_TRANSACTIONS}
    assert busy == codes.COORDINATOR_RETRIABLE


def test_names():
    assert codes.error_name(codes.UNSUPPORTED_VERSION) == "UNSUPPORTED_VERSION"
