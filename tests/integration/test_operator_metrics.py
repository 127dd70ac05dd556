"""What ``curl`` of the metrics endpoint shows an operator during a run (issue 32, part 4), on a real broker: the
phases' histograms, and the oldest open transaction of the prefix rising while a prepared transaction holds
read_committed consumers back, then falling once recovery settles it.

A writer prepares in a child process that is SIGKILLed after prepare. It handed its prepared state over, but the
committer (this process) cannot record the decision: its store is down. The transaction stays prepared. This
process counts it from the hand-over until its recovery aborts it (never decided)."""

import re
import time
import urllib.request
import uuid

import pytest
from prometheus_client import start_http_server

from kafka2pc.cluster import ClusterClient
from kafka2pc.config import ClientConfig
from kafka2pc.errors import StorageUnavailableError
from kafka2pc.prepared_state import PreparedTxnState
from kafka2pc.sink.integration import Committer, Decision, FileDecisionLog, PreparedTransaction, recover
from kafka2pc.testing.verify import end_offsets
from kafka2pc.transaction_control import TransactionControl
from tests.integration.producer_support import crash_writer, producer

pytestmark = pytest.mark.integration

PHASES = ("prepare", "record_decision", "complete", "recovery")


class StoreDown(FileDecisionLog):
    """The decision log's store, unreachable for writes."""

    def record(self, decision: Decision) -> None:
        raise StorageUnavailableError("the decision log's store is down (test)")


def scrape(port: int) -> str:
    """What ``curl http://127.0.0.1:PORT/metrics`` prints."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return answer.read().decode()


def shown(text: str, prefix: str) -> list[str]:
    """The lines an operator looks at: each phase's count by path, the gauge and the settled counter of the
    prefix."""
    phase = re.compile(r"^kafka2pc_({})_seconds_count".format("|".join(PHASES)))
    mine = re.compile(r"^kafka2pc_(oldest_open_transaction_seconds|recovery_settled_transactions_total)\{.*"
                      + re.escape(f'prefix="{prefix}"'))
    return [line for line in text.splitlines() if phase.match(line) or mine.match(line)]


def value(text: str, sample: str) -> float:
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{sample} is not on the endpoint")


@pytest.mark.timeout(120)
def test_curl_shows_the_phases_and_the_oldest_open_transaction_rising_until_recovery(kafka, topic_factory,
                                                                                     tmp_path):
    bootstrap, topic = kafka.bootstrap_servers, topic_factory(kafka)
    prefix = f"ops-{uuid.uuid4().hex[:8]}"
    gauge = f'kafka2pc_oldest_open_transaction_seconds{{prefix="{prefix}"}}'
    server, thread = start_http_server(0, addr="127.0.0.1")
    port = server.server_port
    client = ClusterClient(ClientConfig.for_bootstrap(bootstrap))
    try:
        control = TransactionControl(client)
        # a batch that goes through every phase in this process: prepared, recorded, completed
        with producer(bootstrap, f"{prefix}-1-0") as own:
            own.init_transactions()
            own.begin_transaction()
            own.produce(topic, value=b"committed", partition=0)
            state = own.prepare_transaction()
        Committer(control, FileDecisionLog(tmp_path, prefix)).settle(
            1, [PreparedTransaction(f"{prefix}-1-0", state, 1, 1)])

        report = crash_writer(bootstrap, f"{prefix}-0-0", topic, stage="after-prepare", count=50)
        crashed = PreparedTransaction(f"{prefix}-0-0", PreparedTxnState.parse(report["state"]), 0, 2)
        with pytest.raises(StorageUnavailableError):
            Committer(control, StoreDown(tmp_path, prefix)).settle(2, [crashed])
        assert end_offsets(bootstrap, topic) == {0: 2}  # the prepared transaction pins the LSO after batch 1

        first = scrape(port)
        time.sleep(1.5)
        second = scrape(port)
        recover(control, prefix, FileDecisionLog(tmp_path, prefix))
        third = scrape(port)
    finally:
        client.close()
        server.shutdown()
        thread.join(timeout=10)

    print("\n--- curl while the prepared transaction is open (two readings 1.5 s apart) ---\n"
          + "\n".join(shown(first, prefix)) + "\n...\n" + "\n".join(line for line in shown(second, prefix)
                                                            if line.startswith("kafka2pc_oldest")))
    print("--- curl after recovery ---\n" + "\n".join(shown(third, prefix)))
    assert 0 < value(first, gauge) < value(second, gauge)
    assert value(second, gauge) - value(first, gauge) >= 1.4
    assert value(third, gauge) == 0
    for phase, path in (("prepare", "producer"), ("record_decision", "sink"), ("complete", "sink")):
        assert value(first, f'kafka2pc_{phase}_seconds_count{{path="{path}"}}') >= 1
    assert value(third, 'kafka2pc_recovery_seconds_count{path="sink"}') >= 1
    assert value(third, f'kafka2pc_recovery_settled_transactions_total{{path="sink",prefix="{prefix}",'
                        f'reason="aborted_undecided"}}') == 1
    assert end_offsets(bootstrap, topic, settle_s=10) == {0: 53}  # 1 + its marker, 50 aborted + theirs: free
