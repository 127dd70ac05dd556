import json

import pytest

from kafka2pc.capabilities import BrokerCapabilities
from kafka2pc.cli import build_parser, main
from kafka2pc.cli.doctor import _render_capabilities


def _caps(**overrides):
    fields = dict(
        bootstrap_servers="127.0.0.1:9092", init_producer_id_max_version=6, end_txn_max_version=5,
        list_transactions_max_version=2, describe_transactions_max_version=0, enable_2pc=True,
        enable_2pc_detail="accepted", keep_prepared_txn=False, keep_prepared_txn_detail="refused: UNSUPPORTED_VERSION",
        transaction_version=2, transaction_max_timeout_ms=900000, two_phase_commit_broker_config="true",
    )
    fields.update(overrides)
    return BrokerCapabilities(**fields)


def test_json_dict_has_the_documented_keys():
    data = json.loads(json.dumps(_caps().to_json_dict()))
    assert data["init_producer_id_max_version"] == 6
    assert data["enable_2pc"] is True
    assert data["keep_prepared_txn"] is False
    assert data["list_transactions_pattern_filter"] is True


def test_table_states_the_verdict():
    assert "two-phase commit: ACTIVE" in _render_capabilities(_caps())
    fallback = _render_capabilities(_caps(enable_2pc=False, list_transactions_max_version=1))
    assert "two-phase commit: FALLBACK" in fallback
    assert "transaction.max.timeout.ms=900000" in fallback


def test_doctor_requires_bootstrap(capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["doctor"])
    assert info.value.code == 2
    assert "--bootstrap" in capsys.readouterr().err


def test_bad_config_is_a_clean_error(capsys):
    assert main(["doctor", "--bootstrap", "127.0.0.1:9092", "-X", "no.such.key=1"]) == 1
    assert "config 'no.such.key': unknown configuration key" in capsys.readouterr().err


def test_unreachable_broker_is_a_clean_error(capsys):
    assert main(["doctor", "--bootstrap", "127.0.0.1:1", "--timeout", "1"]) == 1
    assert "no broker answered at 127.0.0.1:1" in capsys.readouterr().err


def test_a_config_pair_without_equals_is_refused_without_showing_its_value(capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["doctor", "--bootstrap", "h:1", "-X", "sasl.password SuperS3cretPW"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "expected key=value, got 'sasl.password'" in err
    assert "SuperS3cretPW" not in err


def test_version_prints_the_package_version(capsys):
    import kafka2pc  # noqa: PLC0415

    # the installed distribution's version, which the package's __version__ repeats
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"kafka2pc {kafka2pc.__version__}"


@pytest.mark.parametrize("dsn", ["postgresql://app:Pw-7q9Zsecret@127.0.0.1:1/shop",
                                 "mysql://app:Pw-7q9Zsecret@127.0.0.1:1/shop"])
def test_an_unreachable_fleet_database_is_a_clean_error_without_the_password(capsys, dsn):
    """It was the driver's traceback (psycopg.OperationalError), found by a DEBUG run of the new code."""
    pytest.importorskip("psycopg" if dsn.startswith("postgresql") else "pymysql")
    assert main(["fleet", "--db", dsn, "--prefix", "shop"]) == 1
    err = capsys.readouterr().err
    assert "kafka2pc fleet: error: --db: cannot connect" in err and "Traceback" not in err
    assert "127.0.0.1" in err and "Pw-7q9Zsecret" not in err
