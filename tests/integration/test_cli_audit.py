"""`kafka2pc audit` against topics written with confluent-kafka transactions on a real broker."""

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer

from kafka2pc.cli import main
from kafka2pc.cluster import ClusterClient
from kafka2pc.config import ClientConfig
from kafka2pc.testing.verify import end_offsets, read_records
from kafka2pc.transaction_control import TransactionControl
from tests.integration.sink_support import leave_lingering

pytestmark = pytest.mark.integration


def audit(capsys, bootstrap: str, topic: str, *args: str) -> tuple[int, str, str]:
    code = main(["audit", "--bootstrap", bootstrap, "--topic", topic, *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def audit_json(capsys, bootstrap: str, topic: str, *args: str) -> tuple[int, dict]:
    code, out, err = audit(capsys, bootstrap, topic, *args, "--json")
    assert code in (0, 1), err
    return code, json.loads(out)


def write(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes | None]], *, partitions: int = 1,
          per_transaction: int = 100, abort: bool = False) -> None:
    """Write ``records`` (key, value) in transactions, record n to partition n % partitions."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"audit-{uuid.uuid4().hex[:10]}"})
    producer.init_transactions(30)
    for start in range(0, len(records), per_transaction):
        producer.begin_transaction()
        for n, (key, value) in enumerate(records[start:start + per_transaction], start):
            producer.produce(topic, key=key, value=value, partition=n % partitions)
        if abort:
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)


def by_id(ids) -> list[tuple[None, bytes]]:
    return [(None, json.dumps({"id": n}).encode()) for n in ids]


def test_clean_topic(kafka, topic_factory, capsys):
    bootstrap = kafka.bootstrap_servers
    topic = topic_factory(kafka, partitions=3)
    write(bootstrap, topic, by_id(range(1000)), partitions=3)

    code, report = audit_json(capsys, bootstrap, topic, "--id-field", "id")
    assert code == 0
    assert report["clean"] is True and report["verdict"] == "CLEAN"
    assert (report["records"], report["distinct_ids"], report["duplicates"], report["gaps"], report["outside_range"],
            report["unreadable"]) == (1000, 1000, 0, 0, 0, 0)
    assert report["range"] == [0, 999] and report["range_source"] == "observed"
    assert report["lso_pinned"] == [] and report["duplicate_examples"] == [] and report["gap_examples"] == []
    assert report["end_offsets"] == {str(p): o for p, o in end_offsets(bootstrap, topic).items()}

    code, report = audit_json(capsys, bootstrap, topic, "--id-field", "id", "--expect-range", "0:999")
    assert code == 0 and report["range"] == [0, 999] and report["range_source"] == "expected"

    table = subprocess.run([str(Path(sys.executable).with_name("kafka2pc")), "audit", "--bootstrap", bootstrap,
                            "--topic", topic, "--id-field", "id"], capture_output=True, text=True, timeout=120,
                           check=False)
    assert table.returncode == 0, table.stderr
    assert "records read    1000" in table.stdout
    assert table.stdout.rstrip().splitlines()[-1] == "verdict: CLEAN"


def test_duplicates_gaps_outside_and_unreadable(kafka, topic_factory, capsys):
    bootstrap = kafka.bootstrap_servers
    topic = topic_factory(kafka, partitions=2)
    wanted = [n for n in range(100) if not 40 <= n <= 49]
    write(bootstrap, topic, by_id(wanted), partitions=2)
    write(bootstrap, topic, by_id(range(40, 50)), partitions=2, abort=True)  # aborted: never visible
    write(bootstrap, topic, [*by_id([7, 60, 7, 150]), (None, b"oops"), (None, b'{"id": "12"}')], partitions=2)

    code, report = audit_json(capsys, bootstrap, topic, "--id-field", "id", "--expect-range", "0:99")
    assert code == 1
    assert report["clean"] is False
    assert report["records"] == 90 + 6
    assert report["distinct_ids"] == 91  # 0..99 without 40..49, and 150
    assert report["duplicates"] == 3
    assert (report["gaps"], report["gap_ranges"], report["gap_examples"]) == (10, 1, [{"from": 40, "to": 49}])
    assert report["outside_range"] == 1
    assert report["unreadable"] == 2
    assert report["lso_pinned"] == []
    assert report["verdict"] == ("NOT CLEAN (3 duplicates, 10 gaps, 1 outside range, LSO pinned on 0 partitions, "
                                 "2 unreadable)")

    seen = read_records(bootstrap, topic)  # the positions, as the harness's own reader sees them
    where: dict[object, list[dict]] = {}
    for record in seen:
        try:
            key = json.loads(record.value)["id"]
        except ValueError:
            key = record.value
        where.setdefault(key, []).append({"partition": record.partition, "offset": record.offset})
    assert report["duplicate_examples"] == [{"id": 7, "copies": 3, "at": where[7]},
                                            {"id": 60, "copies": 2, "at": where[60]}]
    assert report["outside_range_examples"] == [{**where[150][0], "id": 150}]
    assert report["unreadable_examples"] == sorted([*where[b"oops"], *where["12"]],
                                                   key=lambda r: (r["partition"], r["offset"]))

    code, out, _ = audit(capsys, bootstrap, topic, "--id-field", "id", "--expect-range", "0:99")
    assert code == 1
    assert "  40-49" in out
    assert "  id 7: 3 copies at " in out
    assert out.rstrip().splitlines()[-1] == ("verdict: NOT CLEAN (3 duplicates, 10 gaps, 1 outside range, "
                                             "LSO pinned on 0 partitions, 2 unreadable)")


def test_open_transaction_pins_the_lso_until_aborted(kafka, topic_factory, capsys):
    bootstrap = kafka.bootstrap_servers
    topic = topic_factory(kafka)
    write(bootstrap, topic, by_id(range(100)))
    txn_id = f"audit-lingering-{uuid.uuid4().hex[:8]}"
    leave_lingering(bootstrap, topic, [txn_id])  # one open transaction of a SIGKILLed producer
    write(bootstrap, topic, by_id(range(100, 200)))  # committed, but behind the open transaction
    lso = end_offsets(bootstrap, topic)[0]
    high = end_offsets(bootstrap, topic, isolation="read_uncommitted")[0]
    assert high > lso

    with ClusterClient(ClientConfig.for_bootstrap(bootstrap)) as client:
        control = TransactionControl(client)
        observed = control.describe(txn_id)
        assert observed is not None and observed.state == "Ongoing"

        code, report = audit_json(capsys, bootstrap, topic, "--id-field", "id", "--expect-range", "0:199",
                                  "--settle", "1")
        assert code == 1
        assert report["lso_pinned"] == [{
            "partition": 0, "lso": lso, "high_watermark": high, "lag": high - lso,
            "open_transactions": [{"producer_id": observed.producer_id, "producer_epoch": observed.epoch,
                                   "start_offset": lso, "transactional_id": txn_id, "state": "Ongoing"}]}]
        assert report["records"] == 100  # what lies behind the LSO cannot be read yet
        assert (report["gaps"], report["gap_examples"]) == (100, [{"from": 100, "to": 199}])
        assert report["verdict"].endswith("LSO pinned on 1 partitions, 0 unreadable)")
        code, out, _ = audit(capsys, bootstrap, topic, "--id-field", "id", "--settle", "1")
        assert code == 1
        assert f"producer id {observed.producer_id} epoch {observed.epoch} from offset {lso}: " \
               f"transactional id '{txn_id}' (Ongoing)" in out

        assert control.abort_ongoing(txn_id) is not None

    code, report = audit_json(capsys, bootstrap, topic, "--id-field", "id", "--expect-range", "0:199")
    assert code == 0, report
    assert report["records"] == 200 and report["lso_pinned"] == [] and report["clean"] is True


def test_id_from_key(kafka, topic_factory, capsys):
    bootstrap = kafka.bootstrap_servers
    topic = topic_factory(kafka, partitions=3)
    records = [(str(n).encode(), b"\x00binary") for n in range(500) if n != 250]
    records += [(b"12", b"again"), (None, b"no key"), (b"x1", b"bad key")]
    write(bootstrap, topic, records, partitions=3)

    code, report = audit_json(capsys, bootstrap, topic, "--id-from-key")
    assert code == 1
    assert (report["records"], report["distinct_ids"], report["duplicates"], report["gaps"],
            report["unreadable"]) == (502, 499, 1, 1, 2)
    assert report["gap_examples"] == [{"from": 250, "to": 250}]
    assert [d["id"] for d in report["duplicate_examples"]] == [12]

    clean = topic_factory(kafka, partitions=3)
    write(bootstrap, clean, [(str(n).encode(), None) for n in range(500)], partitions=3)
    code, report = audit_json(capsys, bootstrap, clean, "--id-from-key", "--expect-range", "0:499")
    assert code == 0 and report["records"] == 500 and report["clean"] is True


def test_errors_exit_2(kafka, capsys):
    code, out, err = audit(capsys, kafka.bootstrap_servers, f"no-such-topic-{uuid.uuid4().hex[:6]}", "--id-field",
                           "id")
    assert code == 2 and out == ""
    assert err.startswith("kafka2pc audit: error: topic 'no-such-topic-")
    code, _, err = audit(capsys, kafka.bootstrap_servers, "t", "--id-field", "id", "-X", "no.such.key=1")
    assert code == 2 and "config 'no.such.key': unknown configuration key" in err
    with pytest.raises(SystemExit) as usage:
        main(["audit", "--bootstrap", kafka.bootstrap_servers, "--topic", "t"])
    assert usage.value.code == 2
    assert "one of the arguments --id-from-key --id-field is required" in capsys.readouterr().err
