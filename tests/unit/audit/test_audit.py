"""The audit's pure computation: figures and examples from (partition, offset, id) entries, no broker."""

import argparse
import json
import sys
import time
from types import SimpleNamespace

import pytest

from kafka2pc.audit import (
    DuplicateExample,
    GapRange,
    OpenTransaction,
    PinnedPartition,
    RecordDecoder,
    RecordRef,
    audit_topic,
)
from kafka2pc.audit.reader import librdkafka_config
from kafka2pc.audit.tally import compute_report
from kafka2pc.cli.audit import parse_range, render_report
from kafka2pc.errors import AuditError, ConfigError


def entries(ids, partitions=1):
    """Ids spread round-robin over partitions, offsets counting up per partition."""
    next_offset = [0] * partitions
    out = []
    for n, record_id in enumerate(ids):
        p = n % partitions
        out.append((p, next_offset[p], record_id))
        next_offset[p] += 1
    return out


def ends_of(items):
    ends = {}
    for p, o, *_ in items:
        ends[p] = max(ends.get(p, 0), o + 1)
    return ends


def test_clean_input():
    items = entries(range(1000), partitions=3)
    report = compute_report(items, end_offsets=ends_of(items))
    assert (report.records, report.distinct_ids, report.duplicates, report.gaps, report.outside_range,
            report.unreadable) == (1000, 1000, 0, 0, 0, 0)
    assert report.range == (0, 999) and not report.range_expected
    assert report.lso_pinned == ()
    assert report.clean and report.verdict == "CLEAN"
    data = json.loads(json.dumps(report.to_json_dict()))
    assert data["clean"] is True and data["range"] == [0, 999] and data["range_source"] == "observed"
    assert data["end_offsets"] == {"0": 334, "1": 333, "2": 333}
    assert render_report(report).endswith("\nverdict: CLEAN")


def test_empty_topic_is_clean_without_a_range_and_all_gap_with_one():
    assert compute_report([], end_offsets={0: 0}).clean
    expected = compute_report([], expect_range=(1, 10), end_offsets={0: 0})
    assert (expected.gaps, expected.gap_ranges, expected.gap_examples) == (10, 1, (GapRange(1, 10),))


def test_duplicates_count_extra_copies_and_show_the_smallest_ids_with_positions():
    items = [(0, 0, 5), (1, 0, 9), (0, 1, 6), (1, 1, 5), (0, 2, 9), (0, 3, 5), (1, 2, 7), (1, 3, 3), (0, 4, 3)]
    report = compute_report(items, end_offsets={0: 5, 1: 4}, max_examples=2)
    assert report.records == 9
    assert report.distinct_ids == 5  # 3, 5, 6, 7, 9
    assert report.duplicates == 4  # 5 twice more, 9 once, 3 once
    assert report.duplicate_examples == (
        DuplicateExample(3, 2, (RecordRef(0, 4), RecordRef(1, 3))),
        DuplicateExample(5, 3, (RecordRef(0, 0), RecordRef(0, 3), RecordRef(1, 1))),
    )
    assert report.gaps == 2 and report.gap_examples == (GapRange(4, 4), GapRange(8, 8))  # range 3..9
    assert report.verdict == "NOT CLEAN (4 duplicates, 2 gaps, 0 outside range, LSO pinned on 0 partitions, " \
                             "0 unreadable)"
    assert "  id 5: 3 copies at 0:0, 0:3, 1:1" in render_report(report)


def test_duplicate_examples_keep_the_smallest_ids_whatever_the_order():
    items = entries([50, 40, 30, 20, 10, 50, 40, 30, 20, 10, 10])
    report = compute_report(items, max_examples=2)
    assert report.duplicates == 6
    assert [(d.record_id, d.copies) for d in report.duplicate_examples] == [(10, 3), (20, 2)]
    assert report.duplicate_examples[0].at == (RecordRef(0, 4), RecordRef(0, 9), RecordRef(0, 10))
    assert report.to_json_dict()["duplicate_examples"][1] == {
        "id": 20, "copies": 2, "at": [{"partition": 0, "offset": 3}, {"partition": 0, "offset": 8}]}


def test_gaps_are_counted_per_id_and_shown_as_ranges():
    ids = [i for i in range(100) if not 10 <= i <= 19 and i not in (42, 77, 78)]
    report = compute_report(entries(ids, partitions=2), max_examples=2)
    assert report.range == (0, 99)
    assert report.gaps == 13
    assert report.gap_ranges == 3
    assert report.gap_examples == (GapRange(10, 19), GapRange(42, 42))
    assert report.to_json_dict()["gap_examples"] == [{"from": 10, "to": 19}, {"from": 42, "to": 42}]
    assert report.verdict == "NOT CLEAN (0 duplicates, 13 gaps, 0 outside range, LSO pinned on 0 partitions, " \
                             "0 unreadable)"
    assert "  10-19, 42, ... (1 more)" in render_report(report)


def test_expected_range_finds_missing_ends_and_records_outside():
    items = entries([-1, 2, 3, 4, 12, 2, 12])
    report = compute_report(items, expect_range=(0, 9))
    assert report.range == (0, 9) and report.range_expected
    assert report.gaps == 7  # 0, 1 and 5..9
    assert report.gap_ranges == 2
    assert report.gap_examples == (GapRange(0, 1), GapRange(5, 9))
    assert report.outside_range == 3  # -1 and both copies of 12
    assert report.outside_range_examples == (RecordRef(0, 0, -1), RecordRef(0, 4, 12), RecordRef(0, 6, 12))
    assert report.duplicates == 2  # 2 and 12
    assert report.distinct_ids == 5
    assert report.to_json_dict()["range"] == [0, 9]
    assert report.to_json_dict()["outside_range_examples"][0] == {"partition": 0, "offset": 0, "id": -1}


def test_unreadable_records_are_counted_and_located_never_skipped():
    items = [(1, 7, None), (0, 0, 0), (0, 1, None), (0, 2, 1), (1, 3, None), (0, 3, None)]
    report = compute_report(items, max_examples=3)
    assert report.records == 6
    assert report.unreadable == 4
    assert report.unreadable_examples == (RecordRef(0, 1), RecordRef(0, 3), RecordRef(1, 3))
    assert (report.distinct_ids, report.gaps, report.duplicates) == (2, 0, 0)
    assert not report.clean
    assert report.verdict.endswith("4 unreadable)")
    assert "  at 0:1, 0:3, 1:3, ... (1 more)" in render_report(report)


def test_pinned_lso_names_partition_lag_and_open_transactions():
    items = entries(range(10), partitions=2)
    txn = OpenTransaction(producer_id=17, producer_epoch=0, start_offset=5, transactional_id="orders-0",
                          state="Ongoing")
    report = compute_report(items, end_offsets={0: 5, 1: 5}, high_watermarks={0: 5, 1: 8},
                            open_transactions={1: [txn]})
    assert report.lso_pinned == (PinnedPartition(1, 5, 8, (txn,)),)
    assert report.lso_pinned[0].lag == 3
    assert (report.duplicates, report.gaps) == (0, 0)
    assert report.verdict == "NOT CLEAN (0 duplicates, 0 gaps, 0 outside range, LSO pinned on 1 partitions, " \
                             "0 unreadable)"
    assert report.to_json_dict()["lso_pinned"] == [{
        "partition": 1, "lso": 5, "high_watermark": 8, "lag": 3,
        "open_transactions": [{"producer_id": 17, "producer_epoch": 0, "start_offset": 5,
                               "transactional_id": "orders-0", "state": "Ongoing"}]}]
    table = render_report(report)
    assert "partition 1: LSO 5, high watermark 8 (3 offsets not readable yet)" in table
    assert "producer id 17 epoch 0 from offset 5: transactional id 'orders-0' (Ongoing)" in table


def test_groups_are_audited_separately():
    items = [(0, 0, 0, "a"), (0, 1, 1, "a"), (0, 2, 3, "a"), (1, 0, 0, "b"), (1, 1, 1, "b"), (1, 2, 1, "b"),
             (1, 3, 2, "b"), (0, 3, 0, "10"), (0, 4, 1, "2")]
    report = compute_report(items, grouped=True)
    assert report.distinct_ids == 8  # ids repeat across groups without being duplicates
    assert report.duplicates == 1
    assert report.duplicate_examples == (DuplicateExample(1, 2, (RecordRef(1, 1), RecordRef(1, 2)), "b"),)
    assert report.gaps == 1 and report.gap_examples == (GapRange(2, 2, "a"),)
    assert [g.group for g in report.groups] == ["2", "10", "a", "b"]
    data = report.to_json_dict()
    assert data["groups"]["a"] == {"records": 3, "distinct_ids": 3, "duplicates": 0, "gaps": 1, "gap_ranges": 1,
                                   "gap_examples": [{"from": 2, "to": 2, "group": "a"}], "range": [0, 3]}
    assert data["gap_examples"] == [{"from": 2, "to": 2, "group": "a"}]


@pytest.mark.parametrize(("decoder", "key", "value", "expected"), [
    (RecordDecoder(), b"42", None, (42, None)),
    (RecordDecoder(), b"-3", b"x", (-3, None)),
    (RecordDecoder(), b"4 2", None, None),
    (RecordDecoder(), b"1_000", None, None),
    (RecordDecoder(), None, b"1", None),
    (RecordDecoder(id_field="id"), None, b'{"id": 7}', (7, None)),
    (RecordDecoder(id_field="id"), None, b'{"id": "7"}', None),
    (RecordDecoder(id_field="id"), None, b'{"id": true}', None),
    (RecordDecoder(id_field="id"), None, b'{"id": 7.5}', None),
    (RecordDecoder(id_field="id"), None, b"not json", None),
    (RecordDecoder(id_field="id"), None, b"\xff\xfe", None),
    (RecordDecoder(id_field="id"), None, b"[1]", None),
    (RecordDecoder(id_field="id"), None, None, None),
    (RecordDecoder(id_field="a.b"), None, b'{"a": {"b": 9}}', (9, None)),
    (RecordDecoder(id_field="a.b"), None, b'{"a": 9}', None),
    (RecordDecoder(id_field="id", group_field="src.p"), None, b'{"id": 1, "src": {"p": 3}}', (1, "3")),
    (RecordDecoder(id_field="id", group_field="g"), None, b'{"id": 1, "g": "x"}', (1, "x")),
    (RecordDecoder(id_field="id", group_field="g"), None, b'{"id": 1}', None),
    (RecordDecoder(group_field="g"), b"5", b'{"g": "x"}', (5, "x")),
])
def test_decoder(decoder, key, value, expected):
    assert decoder.decode(key, value) == expected


def test_parse_range():
    assert parse_range("0:999") == (0, 999)
    assert parse_range("-5:-5") == (-5, -5)
    for bad in ("5", "9:1", "a:b", "1:"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_range(bad)


class _FakeConfluent:
    """Just enough of confluent_kafka for a consumer that never gets past offset 0."""

    OFFSET_BEGINNING = -2

    class KafkaException(Exception):
        pass

    class TopicPartition:
        def __init__(self, topic, partition, offset=-1001):
            self.topic, self.partition, self.offset = topic, partition, offset

    class Consumer:
        def __init__(self, config):
            self.config = config

        def list_topics(self, topic, timeout):
            partition_meta = {0: object()}
            return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions=partition_meta)})

        def get_watermark_offsets(self, tp, cached, timeout):
            return (0, 10)

        def assign(self, partitions):
            pass

        def consume(self, num_messages, timeout):
            time.sleep(timeout)
            return []

        def position(self, partitions):
            return [_FakeConfluent.TopicPartition(p.topic, p.partition, 0) for p in partitions]

        def close(self):
            pass


def test_reading_is_bounded_by_the_timeout(monkeypatch):
    monkeypatch.setitem(sys.modules, "confluent_kafka", _FakeConfluent)
    started = time.monotonic()
    with pytest.raises(AuditError, match=r"t: did not reach end offsets \{0: 10\} within --timeout 0.5 s "
                                         r"\(reached \{0: 0\}\)"):
        audit_topic({"bootstrap.servers": "127.0.0.1:9092"}, "t", RecordDecoder(id_field="id"), timeout_s=0.5)
    assert time.monotonic() - started < 2


class _LeaderChanging(_FakeConfluent):
    """A partition whose new leader's high watermark is not caught up yet, for its first two ListOffsets."""

    class KafkaError:
        def __init__(self, code):
            self._code = code

        def code(self):
            return self._code

    class Consumer(_FakeConfluent.Consumer):
        refused = 0

        def get_watermark_offsets(self, tp, cached, timeout):
            if _LeaderChanging.Consumer.refused < 2:
                _LeaderChanging.Consumer.refused += 1
                raise _LeaderChanging.KafkaException(_LeaderChanging.KafkaError(78))  # OFFSET_NOT_AVAILABLE
            return (0, 0)


def test_offsets_are_asked_again_while_a_partition_changes_leader(monkeypatch):
    """Found by make chaos (the rolling restart): ListOffsets right after a leader came back answered
    OFFSET_NOT_AVAILABLE ('Leader high watermark is not caught up') and the audit ended in AuditError."""
    monkeypatch.setitem(sys.modules, "confluent_kafka", _LeaderChanging)
    report = audit_topic({"bootstrap.servers": "127.0.0.1:9092"}, "t", RecordDecoder(id_field="id"), timeout_s=5)
    assert _LeaderChanging.Consumer.refused == 2 and report.records == 0


def test_an_error_that_is_not_a_leader_change_is_not_asked_again(monkeypatch):
    class Broken(_LeaderChanging):
        class Consumer(_FakeConfluent.Consumer):
            def get_watermark_offsets(self, tp, cached, timeout):
                raise Broken.KafkaException(Broken.KafkaError(29))  # TOPIC_AUTHORIZATION_FAILED

    monkeypatch.setitem(sys.modules, "confluent_kafka", Broken)
    started = time.monotonic()
    with pytest.raises(AuditError):
        audit_topic({"bootstrap.servers": "127.0.0.1:9092"}, "t", RecordDecoder(id_field="id"), timeout_s=5)
    assert time.monotonic() - started < 1


def test_without_confluent_kafka_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "confluent_kafka", None)
    with pytest.raises(AuditError, match=r"pip install kafka2pc\[audit\]"):
        audit_topic({"bootstrap.servers": "127.0.0.1:9092"}, "t", RecordDecoder())


def test_connection_settings_are_validated_and_passed_to_librdkafka():
    assert librdkafka_config({"bootstrap.servers": "h:1", "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
                              "sasl.username": "u", "sasl.password": "p1234", "request.timeout.ms": "5000",
                              "ssl.ca.pem": "PEM"}) == {
        "bootstrap.servers": "h:1", "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "u",
        "sasl.password": "p1234", "ssl.ca.pem": "PEM", "enable.ssl.certificate.verification": "true",
        "ssl.endpoint.identification.algorithm": "https"}
    with pytest.raises(ConfigError, match=r"no\.such\.key"):
        librdkafka_config({"bootstrap.servers": "h:1", "no.such.key": "1"})


def test_the_same_id_twice_at_one_position_still_counts_as_a_duplicate():
    report = compute_report([(0, 3, 1), (0, 3, 1)])
    assert (report.records, report.distinct_ids, report.duplicates) == (2, 1, 1)
