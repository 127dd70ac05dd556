from kafka.record.default_records import DefaultRecordBatch

from kafka2pc._data.accumulator import RecordAccumulator
from kafka2pc._data.records import encode_batch

TP = ("topic", 0)


def frame(batch):
    return DefaultRecordBatch(encode_batch(batch.records, batch.count, base_timestamp=batch.base_timestamp,
                                           max_timestamp=batch.max_timestamp, producer_id=1, producer_epoch=0,
                                           base_sequence=0))


def test_records_split_into_batches_of_bounded_size():
    acc = RecordAccumulator(batch_size=1000)
    for i in range(100):
        acc.append(TP, None, b"v" * 50, None, 1000 + i)
    assert acc.buffered_records == 100
    batches = []
    while not acc.is_empty():
        batches += acc.drain(include_open=True)
    assert sum(b.count for b in batches) == 100
    assert all(len(b.records) <= 1000 for b in batches)
    decoded = [r for b in batches for r in frame(b)]
    assert [r.timestamp for r in decoded] == [1000 + i for i in range(100)]
    assert acc.buffered_bytes == 0 and acc.buffered_records == 0


def test_bulk_values_chunked_and_ordered_after_singles():
    acc = RecordAccumulator(batch_size=4096)
    acc.append(TP, b"k", b"first", [("h", b"1")], 5)
    acc.append_values(TP, [f"{i:04d}".encode() * 25 for i in range(200)], None, 7)
    batches = []
    while not acc.is_empty():
        batches += acc.drain(include_open=False)
    assert batches[0].count == 1  # the open batch was closed first, so order is kept
    values = [r.value for b in batches for r in frame(b)]
    assert values[0] == b"first"
    assert values[1:] == [f"{i:04d}".encode() * 25 for i in range(200)]
    assert max(len(b.records) for b in batches[1:]) <= 4096


def test_drain_takes_one_batch_per_partition_and_requeue_restores_order():
    acc = RecordAccumulator(batch_size=10)
    for tp in (("a", 0), ("a", 1)):
        acc.append_values(tp, [b"x" * 20, b"y" * 20], None, 1)
    first = acc.drain(include_open=False)
    assert sorted((b.topic, b.partition) for b in first) == [("a", 0), ("a", 1)]
    acc.requeue_front(first[0])
    again = acc.drain(include_open=False)
    assert first[0] in again


def test_oversized_record_gets_a_batch_alone():
    acc = RecordAccumulator(batch_size=100)
    acc.append(TP, None, b"a" * 10, None, 1)
    acc.append(TP, None, b"b" * 500, None, 1)
    acc.append(TP, None, b"c" * 10, None, 1)
    acc.append_values(("bulk", 0), [b"x" * 500, b"y"], None, 1)
    counts = []
    while not acc.is_empty():
        counts += [(b.topic, b.count) for b in acc.drain(include_open=True)]
    assert sorted(counts) == [("bulk", 1), ("bulk", 1), ("topic", 1), ("topic", 1), ("topic", 1)]


def test_clear_drops_everything():
    acc = RecordAccumulator(batch_size=100)
    acc.append(TP, None, b"v", None, 1)
    acc.append_values(("b", 1), [b"z"], [b"k"], 1)
    assert acc.partitions() == {TP, ("b", 1)}
    acc.clear()
    assert acc.is_empty() and acc.buffered_bytes == 0
