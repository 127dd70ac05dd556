"""`kafka2pc doctor` reports what the broker actually answered."""

import json
import subprocess
import sys

import pytest

from kafka2pc.testing import PRE_2PC_KAFKA_VERSION, BrokerSettings

pytestmark = pytest.mark.integration


def doctor_json(bootstrap: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "kafka2pc.cli", "doctor", "--bootstrap", bootstrap, "--json"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_newest_release_accepts_enable_2pc(kafka):
    report = doctor_json(kafka.bootstrap_servers)
    assert report["init_producer_id_max_version"] == 6
    assert report["enable_2pc"] is True
    assert report["enable_2pc_detail"].startswith("accepted")
    assert isinstance(report["keep_prepared_txn"], bool)
    # keepPreparedTxn is reported from the broker's answer, never assumed: either accepted, or refused with a code.
    assert report["keep_prepared_txn_detail"].startswith("accepted" if report["keep_prepared_txn"] else "refused: ")
    assert report["transaction_version"] == 2
    assert report["list_transactions_pattern_filter"] is True
    assert report["transaction_max_timeout_ms"] == 900_000
    assert report["two_phase_commit_broker_config"] == "true"


def test_pre_2pc_release_is_reported_without_enable_2pc(kafka_pre2pc):
    report = doctor_json(kafka_pre2pc.bootstrap_servers)
    assert kafka_pre2pc.settings.version == PRE_2PC_KAFKA_VERSION
    assert report["init_producer_id_max_version"] == 5
    assert report["enable_2pc"] is False
    assert report["keep_prepared_txn"] is False
    assert "InitProducerId up to v5" in report["enable_2pc_detail"]
    assert report["list_transactions_pattern_filter"] is False
    assert report["two_phase_commit_broker_config"] is None


def test_newest_release_with_2pc_config_off_refuses(kafka_factory):
    service = kafka_factory(BrokerSettings(two_phase_commit=False, transaction_max_timeout_ms=10_000,
                                           extra={"unstable.api.versions.enable": "true"}))
    report = doctor_json(service.bootstrap_servers)
    assert report["init_producer_id_max_version"] == 6
    assert report["enable_2pc"] is False
    assert report["enable_2pc_detail"].startswith("refused: TRANSACTIONAL_ID_AUTHORIZATION_FAILED")
    assert "transaction.two.phase.commit.enable=false" in report["enable_2pc_detail"]
    assert report["keep_prepared_txn"] is False
    assert report["transaction_max_timeout_ms"] == 10_000
    assert report["two_phase_commit_broker_config"] == "false"


def test_newest_release_hides_init_producer_id_v6_without_unstable_api_versions(kafka_factory):
    service = kafka_factory(BrokerSettings(extra={"unstable.api.versions.enable": "false"}))
    report = doctor_json(service.bootstrap_servers)
    assert report["two_phase_commit_broker_config"] == "true"
    assert report["init_producer_id_max_version"] == 5
    assert report["enable_2pc"] is False
    assert "InitProducerId up to v5" in report["enable_2pc_detail"]


def test_table_output_names_the_verdict(kafka):
    proc = subprocess.run([sys.executable, "-m", "kafka2pc.cli", "doctor", "--bootstrap", kafka.bootstrap_servers],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "Enable2Pc accepted" in proc.stdout
    assert "two-phase commit: ACTIVE" in proc.stdout
