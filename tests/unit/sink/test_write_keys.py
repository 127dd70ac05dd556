"""Idempotent-write keys (txnAppId, txnVersion): a decided key writes nothing, a higher version writes, a lower one is
refused; the newest decision carries every application's last version forward."""

import pytest

from kafka2pc.errors import ConfigError, StaleWriteVersionError
from kafka2pc.sink.integration import Decision
from kafka2pc.sink.write_keys import METADATA_KEY, Verdict, WriteKey, decided_versions, verdict, with_decided


def test_a_version_above_the_last_decided_one_writes_and_the_same_one_is_a_replay():
    versions = {"orders-job": 7}
    assert verdict(versions, WriteKey("orders-job", 8), where="ck") is Verdict.WRITE
    assert verdict(versions, WriteKey("orders-job", 7), where="ck") is Verdict.ALREADY_DECIDED
    assert verdict(versions, WriteKey("other-job", 0), where="ck") is Verdict.WRITE
    assert verdict({}, WriteKey("orders-job", 0), where="ck") is Verdict.WRITE


def test_a_lower_version_is_refused_naming_both_versions():
    with pytest.raises(StaleWriteVersionError, match=r"txnVersion 6 of txnAppId 'orders-job' is below .* \(7\) at ck"):
        verdict({"orders-job": 7}, WriteKey("orders-job", 6), where="ck")


def test_the_newest_decision_carries_every_applications_version():
    carried = with_decided({"a": 3, "b": 9}, WriteKey("a", 4))
    assert carried == {"a": 4, "b": 9}
    assert with_decided(carried, None) == carried  # an unkeyed write keeps them
    newest = Decision(12, (), {METADATA_KEY: carried})
    assert decided_versions(newest) == {"a": 4, "b": 9}
    assert decided_versions(Decision(3, (), {})) == {}  # decisions written before keys existed
    assert decided_versions(None) == {}


@pytest.mark.parametrize(("app_id", "version", "key"), [
    ("", 1, "txnAppId"), ("  ", 1, "txnAppId"), ("x" * 256, 1, "txnAppId"), ("a", -1, "txnVersion"),
    ("a", True, "txnVersion"), ("a", "3", "txnVersion"),
])
def test_bad_keys_are_config_errors(app_id, version, key):
    with pytest.raises(ConfigError) as raised:
        WriteKey(app_id, version)
    assert raised.value.key == key
