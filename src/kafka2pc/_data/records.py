"""Kafka record batches (message format v2, magic 2) for transactional, idempotent producers.

A lean encoder: records are laid out with cached zig-zag varints and joined once, several times faster than
kafka-python's general-purpose ``DefaultRecordBatchBuilder`` on this path (docs/design.md has the measurement).
Compression codecs and the CRC-32C come from maintained libraries (kafka-python's ``kafka.codec``, ``crc32c``).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from functools import lru_cache

import attrs
import crc32c as _crc32c
from kafka import codec

from kafka2pc.errors import ConfigError

MAGIC = 2
_TRANSACTIONAL = 0x10
COMPRESSION_CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
_COMPRESSORS = {1: codec.gzip_encode, 2: codec.snappy_encode, 3: codec.lz4_encode, 4: codec.zstd_encode}
_AVAILABLE = {1: codec.has_gzip, 2: codec.has_snappy, 3: codec.has_lz4, 4: codec.has_zstd}

# baseOffset, batchLength, partitionLeaderEpoch, magic, crc
_PREFIX = struct.Struct(">qiibI")
# attributes, lastOffsetDelta, baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, recordCount
_AFTER_CRC = struct.Struct(">hiqqqhii")
BATCH_OVERHEAD = _PREFIX.size + _AFTER_CRC.size  # 61 bytes

Header = tuple[str, bytes | None]


def compression_codec(name: str) -> int:
    """The attribute bits of a ``compression.type`` value; a ConfigError names an unknown or missing codec."""
    code = COMPRESSION_CODECS.get(name)
    if code is None:
        raise ConfigError("compression.type", f"expected one of {', '.join(COMPRESSION_CODECS)}, got {name!r}")
    if code and not _AVAILABLE[code]():
        raise ConfigError("compression.type", f"{name} needs its Python package installed (see kafka-python's docs)")
    return code


def _zigzag(value: int) -> int:
    return (value << 1) ^ (value >> 63)


@lru_cache(maxsize=65536)
def varint(value: int) -> bytes:
    """Kafka's zig-zag varint encoding of a signed integer."""
    number = _zigzag(value) & 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while number >= 0x80:
        out.append((number & 0x7F) | 0x80)
        number >>= 7
    out.append(number)
    return bytes(out)


_NULL = varint(-1)
_ZERO = varint(0)
#: varints of 0 .. 16383 (offset deltas, key and value lengths), looked up on the hot path instead of computed
_SMALL = tuple(varint(n) for n in range(1 << 14))
_SMALL_LIMIT = len(_SMALL)


def _varint(number: int) -> bytes:
    return _SMALL[number] if 0 <= number < _SMALL_LIMIT else varint(number)


def _bytes_field(data: bytes | None) -> bytes:
    return _NULL if data is None else _varint(len(data)) + data


def _encode_headers(headers: Sequence[Header] | None) -> bytes:
    if not headers:
        return _ZERO
    parts = [varint(len(headers))]
    for key, value in headers:
        encoded_key = key.encode()
        parts.append(varint(len(encoded_key)))
        parts.append(encoded_key)
        parts.append(_bytes_field(value))
    return b"".join(parts)


def encode_record(offset_delta: int, timestamp_delta: int, key: bytes | None, value: bytes | None,
                  headers: Sequence[Header] | None = None) -> bytes:
    """One record of a v2 batch, with its length prefix."""
    small, limit = _SMALL, _SMALL_LIMIT  # the varints of small numbers, inlined: this runs once per record
    body = b"".join((
        b"\x00", small[timestamp_delta] if 0 <= timestamp_delta < limit else varint(timestamp_delta),
        small[offset_delta] if offset_delta < limit else varint(offset_delta),
        _NULL if key is None else (small[len(key)] if len(key) < limit else varint(len(key))) + key,
        _NULL if value is None else (small[len(value)] if len(value) < limit else varint(len(value))) + value,
        _encode_headers(headers) if headers else _ZERO))
    size = len(body)
    return (small[size] if size < limit else varint(size)) + body


def encode_values(values: Sequence[bytes], keys: Sequence[bytes | None] | None) -> bytes:
    """Records for ``values`` (and ``keys``) at timestamp delta 0, offset deltas 0..n-1, no headers: the fast path."""
    parts: list[bytes] = []
    append = parts.append
    small, limit, encode = _SMALL, _SMALL_LIMIT, _varint
    # two copies of the loop on purpose: one loop over zip(repeat(null key) | keys, values) is 3-5 % slower here
    if keys is None:
        for delta, value in enumerate(values):
            size = len(value)
            head = b"\x00\x00" + (small[delta] if delta < limit else encode(delta)) + b"\x01" + \
                (small[size] if size < limit else encode(size))
            body = len(head) + size + 1
            append(small[body] if body < limit else encode(body))
            append(head)
            append(value)
            append(b"\x00")
    else:
        for delta, (key, value) in enumerate(zip(keys, values, strict=True)):
            size = len(value)
            head = b"\x00\x00" + (small[delta] if delta < limit else encode(delta)) + _bytes_field(key) + \
                (small[size] if size < limit else encode(size))
            body = len(head) + size + 1
            append(small[body] if body < limit else encode(body))
            append(head)
            append(value)
            append(b"\x00")
    return b"".join(parts)


def encode_batch(records: bytes, record_count: int, *, base_timestamp: int, max_timestamp: int, producer_id: int,
                 producer_epoch: int, base_sequence: int, transactional: bool = True, compression: int = 0) -> bytes:
    """A complete v2 record batch around already encoded ``records`` (see :func:`encode_record`)."""
    if compression:
        records = _COMPRESSORS[compression](records)
    attributes = (_TRANSACTIONAL if transactional else 0) | compression
    after_crc = _AFTER_CRC.pack(attributes, record_count - 1, base_timestamp, max_timestamp, producer_id,
                                producer_epoch, base_sequence, record_count) + records
    crc = _crc32c.crc32c(after_crc)
    length = len(after_crc) + 9  # partitionLeaderEpoch + magic + crc
    return _PREFIX.pack(0, length, -1, MAGIC, crc) + after_crc


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


#: the most bytes a record takes beyond its key, value and headers (length, attributes, deltas, field lengths)
RECORD_FRAME_BOUND = 21


def record_size_bound(key: bytes | None, value: bytes | None, headers: Sequence[Header] | None = None) -> int:
    """An upper bound of the bytes one record takes in a batch of its own, batch header included."""
    header_bytes = sum(len(k.encode()) + len(v or b"") + 10 for k, v in headers or ())
    return BATCH_OVERHEAD + RECORD_FRAME_BOUND + len(key or b"") + len(value or b"") + header_bytes


@attrs.frozen
class RecordRun:
    """Encoded records (see :func:`encode_record`) with offset deltas 0..count-1, and their largest timestamp
    delta."""

    records: bytes
    count: int
    max_timestamp_delta: int


def split_records(records: bytes, count: int) -> tuple[RecordRun, RecordRun]:
    """Split encoded records into two halves; the second half's offset deltas are renumbered from 0. For a batch the
    broker refused as too large (the sequence numbers are then assigned anew)."""
    if count < 2:
        raise ValueError("a single record cannot be split")
    half = count // 2
    first, second = bytearray(), bytearray()
    first_max = second_max = 0
    pos = 0
    for index in range(count):
        length, body_start = _read_varint(records, pos)
        end = body_start + length
        timestamp_delta, after_timestamp = _read_varint(records, body_start + 1)
        _, after_offset = _read_varint(records, after_timestamp)
        if index < half:
            first += records[pos:end]
            first_max = max(first_max, timestamp_delta)
        else:
            body = records[body_start:after_timestamp] + varint(index - half) + records[after_offset:end]
            second += varint(len(body)) + body
            second_max = max(second_max, timestamp_delta)
        pos = end
    if pos != len(records):
        raise ValueError(f"records end at {pos}, not at {len(records)}")
    return RecordRun(bytes(first), half, first_max), RecordRun(bytes(second), count - half, second_max)
