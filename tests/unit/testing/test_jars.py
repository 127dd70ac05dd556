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


FAKE_MVN = """#!/bin/sh
# a stand-in for Maven: record the pom it was given (-f) and 'resolve' one jar into -DoutputDirectory
pom= out=
while [ $# -gt 0 ]; do
  case "$1" in -f) pom="$2"; shift;; -DoutputDirectory=*) out="${1#-DoutputDirectory=}";; esac; shift
done
cp "$pom" "$out/pom-given.xml" && touch "$out/artifact-1.0.jar"
"""


@pytest.mark.parametrize(("pom", "package", "names"), [
    ("broker-pom.xml", "kafka2pc.testing", "kafka_2.13"),
    ("hdfs-pom.xml", "kafka2pc_harness", "hadoop-minicluster"),
])
def test_the_pom_comes_from_its_package(monkeypatch, tmp_path, pom, package, names):
    """The broker's pom ships in kafka2pc.testing; the harness's poms in kafka2pc_harness, which passes its package."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "mvn").write_text(FAKE_MVN)
    (tmp_path / "bin" / "mvn").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    target = jars.maven_dependencies(tmp_path / "cache" / "x", pom, {"v": "1"}, what="x", expect="artifact-*.jar",
                                     package=package)
    assert names in (target / "pom-given.xml").read_text() and (target / ".complete").exists()
