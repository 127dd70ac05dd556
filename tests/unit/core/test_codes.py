"""The one classification of Kafka's error codes."""

import pathlib
import re

import kafka.errors as kafka_errors
import pytest

from kafka2pc._core import codes


@pytest.mark.parametrize(("code", "kind"), [
    (codes.NONE, codes.Kind.DONE),
    (codes.DUPLICATE_SEQUENCE_NUMBER, codes.Kind.DUPLICATE),  # done, for a Produce only
    (codes.NOT_COORDINATOR, codes.Kind.COORDINATOR_BUSY),
    (codes.CONCURRENT_TRANSACTIONS, codes.Kind.COORDINATOR_BUSY),
    (kafka_errors.NotLeaderForPartitionError.errno, codes.Kind.PARTITION_BUSY),
    (codes.UNKNOWN_TOPIC_OR_PARTITION, codes.Kind.UNKNOWN_TOPIC),
    (codes.TRANSACTIONAL_ID_NOT_FOUND, codes.Kind.UNKNOWN_ID),
    (codes.INVALID_TRANSACTION_TIMEOUT, codes.Kind.TIMEOUT_REFUSED),
    (codes.INVALID_PRODUCER_ID_MAPPING, codes.Kind.STALE),
    (kafka_errors.NotEnoughReplicasError.errno, codes.Kind.PARTITION_BUSY),
    (codes.REQUEST_TIMED_OUT, codes.Kind.TIMED_OUT),  # a slow replica, or a block of producer ids awaited
    (codes.COORDINATOR_LOAD_IN_PROGRESS, codes.Kind.COORDINATOR_BUSY),
    (codes.COORDINATOR_NOT_AVAILABLE, codes.Kind.COORDINATOR_BUSY),
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


def test_every_kind_has_a_code_but_other():
    assert {found for found in codes._KINDS.values()} == set(codes.Kind) - {codes.Kind.OTHER}


#: a raw comparison of an error code: ``error == ...``, ``error_code != 0``, ``codes.X ==``, ``in codes.``
RAW = re.compile(r"(error(_code)?\s*[!=]=)|([!=]=\s*codes\.)|(codes\.[A-Z_]+\s*[!=]=)|(\bin codes\.)|(errno\s*[!=]=)|"
                 r"([!=]=\s*kafka_errors\.)")
#: the layers that read answers, and the facades on them
READERS = ("_core", "_data", "_wire", "capabilities.py", "producer.py", "transaction_control.py", "cluster.py")


def test_every_code_is_read_through_its_kind():
    """No module compares an error code raw: codes.kind() is the one classification (codes.py says how to add a
    code)."""
    root = pathlib.Path(codes.__file__).resolve().parents[1]
    files = [p for name in READERS for p in ((root / name).rglob("*.py") if (root / name).is_dir() else [root / name])]
    assert len(files) > 20
    raw = [f"{p.relative_to(root)}:{n}: {line.strip()}" for p in files if p.name != "codes.py"
           for n, line in enumerate(p.read_text().splitlines(), 1) if RAW.search(line.split("#")[0])]
    assert raw == []


def test_names():
    assert codes.error_name(codes.UNSUPPORTED_VERSION) == "UNSUPPORTED_VERSION"
