"""The lean batch encoder produces what Kafka's (and kafka-python's) v2 reader accepts."""

import pytest
from kafka.record.default_records import DefaultRecordBatch

from kafka2pc._data.records import BATCH_OVERHEAD, compression_codec, encode_batch, encode_record, encode_values, varint
from kafka2pc.errors import ConfigError


def decode(batch: bytes) -> DefaultRecordBatch:
    parsed = DefaultRecordBatch(batch)
    assert parsed.validate_crc()
    return parsed


@pytest.mark.parametrize(("value", "encoded"), [(0, b"\x00"), (-1, b"\x01"), (1, b"\x02"), (63, b"\x7e"),
                                                 (64, b"\x80\x01"), (-65, b"\x81\x01"), (300, b"\xd8\x04")])
def test_varint_is_zigzag(value, encoded):
    assert varint(value) == encoded


@pytest.mark.parametrize("with_keys", [False, True])
def test_fast_path_round_trips(with_keys):
    values = [f"value-{i}".encode() * (i % 7 + 1) for i in range(300)]
    keys = [None if i % 3 == 0 else f"k{i}".encode() for i in range(300)] if with_keys else None
    batch = encode_batch(encode_values(values, keys), len(values), base_timestamp=1_700_000_000_000,
                         max_timestamp=1_700_000_000_000, producer_id=42, producer_epoch=7, base_sequence=1000)
    parsed = decode(batch)
    assert parsed.is_transactional
    assert (parsed.producer_id, parsed.producer_epoch, parsed.base_sequence) == (42, 7, 1000)
    records = list(parsed)
    assert [r.value for r in records] == values
    assert [r.key for r in records] == (keys or [None] * 300)
    assert [r.offset for r in records] == list(range(300))
    assert all(r.timestamp == 1_700_000_000_000 for r in records)


def test_general_records_with_headers_and_nulls():
    body = b"".join([
        encode_record(0, 0, b"k", b"v", [("h1", b"x"), ("h2", None)]),
        encode_record(1, 5, None, None),
        encode_record(2, 9, b"", b""),
    ])
    parsed = decode(encode_batch(body, 3, base_timestamp=100, max_timestamp=109, producer_id=1,
                                 producer_epoch=0, base_sequence=0))
    first, second, third = list(parsed)
    assert (first.key, first.value, list(first.headers)) == (b"k", b"v", [("h1", b"x"), ("h2", None)])
    assert (second.key, second.value, second.timestamp) == (None, None, 105)
    assert (third.key, third.value, third.timestamp) == (b"", b"", 109)


def test_records_round_trip_at_the_edges_of_the_small_varint_table():
    """Deltas and lengths on both sides of 16384 (the table of precomputed varints), and a negative timestamp delta
    (a record given an earlier timestamp than the batch's first)."""
    cases = [(0, 0, None, b""), (1, -1, b"k", b"v"), (16383, 16383, b"k" * 16383, b"v" * 16383),
             (16384, 16384, b"k" * 16384, b"v" * 16384), (16385, -70_000, b"", b"v" * 70_000),
             (200_000, 3_600_000, None, None)]
    body = b"".join(encode_record(offset, delta, key, value) for offset, delta, key, value in cases)
    base = 1_700_000_000_000
    records = list(DefaultRecordBatch(encode_batch(body, len(cases), base_timestamp=base,
                                                   max_timestamp=base + 3_600_000, producer_id=1,
                                                   producer_epoch=0, base_sequence=0)))
    assert [(r.offset, r.timestamp - base, r.key, r.value) for r in records] == cases


@pytest.mark.parametrize("codec_name", ["gzip"])
def test_compressed_batch_round_trips(codec_name):
    values = [b"x" * 100] * 50
    code = compression_codec(codec_name)
    batch = encode_batch(encode_values(values, None), 50, base_timestamp=1, max_timestamp=1, producer_id=1,
                         producer_epoch=0, base_sequence=0, compression=code)
    assert len(batch) < 50 * 100
    assert [r.value for r in decode(batch)] == values


def test_batch_overhead_is_61_bytes():
    assert BATCH_OVERHEAD == 61
    assert len(encode_batch(b"", 0, base_timestamp=0, max_timestamp=0, producer_id=0, producer_epoch=0,
                            base_sequence=0)) == 61


def test_unknown_compression_names_the_key():
    with pytest.raises(ConfigError, match=r"compression\.type"):
        compression_codec("brotli")


def test_split_records_renumbers_the_second_half():
    from kafka2pc._data.records import split_records  # noqa: PLC0415

    records = b"".join(encode_record(i, i * 3, f"k{i}".encode(), b"v" * (i * 50), [("h", b"x")]) for i in range(7))
    first, second = split_records(records, 7)
    assert (first.count, second.count) == (3, 4)
    decoded = []
    for run in (first, second):
        batch = decode(encode_batch(run.records, run.count, base_timestamp=1000,
                                    max_timestamp=1000 + run.max_timestamp_delta, producer_id=1, producer_epoch=0,
                                    base_sequence=0))
        assert batch.max_timestamp == 1000 + run.max_timestamp_delta
        records_read = list(batch)
        assert [r.offset for r in records_read] == list(range(run.count))
        decoded += [(r.key, len(r.value), r.timestamp, r.headers) for r in records_read]
    assert decoded == [(f"k{i}".encode(), i * 50, 1000 + i * 3, [("h", b"x")]) for i in range(7)]
    with pytest.raises(ValueError, match="single record"):
        split_records(encode_record(0, 0, None, b"x"), 1)
