import pytest

from kafka2pc.testing import HarnessSetupError, jars


def test_missing_mvn_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(HarnessSetupError) as info:
        jars.jars_dir("4.4.0", cache_dir=tmp_path / "cache")
    message = str(info.value)
    assert "`mvn` was not found" in message
    assert "Maven" in message and "Java 17" in message and "KAFKA2PC_BOOTSTRAP" in message


def test_complete_marker_short_circuits_resolution(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no mvn: any attempt to resolve would fail
    done = tmp_path / "9.9.9"
    done.mkdir()
    (done / ".complete").write_text("9.9.9\n")
    assert jars.classpath("9.9.9", cache_dir=tmp_path) == f"{done}/*"


def test_cache_dir_follows_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("KAFKA2PC_JARS_DIR", str(tmp_path / "x"))
    assert jars.default_cache_dir() == tmp_path / "x"
