"""The layers of docs/design.md, enforced: every import of every module of src/, parsed, goes down or sideways
within what its layer may use; none goes up or around a facade."""

import ast
import pathlib

import pytest

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"
#: kafka2pc's own test harness, a second distribution (harness/pyproject.toml) that the runtime wheel never needs
HARNESS = pathlib.Path(__file__).resolve().parents[2] / "harness" / "src"

#: layer -> the module prefixes that make it up (the longest prefix decides)
LAYERS = {
    "foundation": ("kafka2pc.errors", "kafka2pc.prepared_state", "kafka2pc.config", "kafka2pc.metrics"),
    "core": ("kafka2pc._core",),
    "data": ("kafka2pc._data",),
    "wire": ("kafka2pc._wire",),
    "facades": ("kafka2pc.producer", "kafka2pc.transaction_control", "kafka2pc.capabilities", "kafka2pc.cluster"),
    "sink": ("kafka2pc.sink",),
    "spark": ("kafka2pc.spark", "pyspark_kafka2pc"),
    "dualwrite": ("kafka2pc.dualwrite",),
    "audit": ("kafka2pc.audit",),
    "cli": ("kafka2pc.cli",),
    "testing": ("kafka2pc.testing",),
    "api": ("kafka2pc",),
}
#: layer -> the layers it may import (its own included)
MAY_IMPORT = {
    "foundation": {"foundation"},
    "core": {"foundation", "core"},
    "data": {"foundation", "core", "data"},
    "wire": {"foundation", "core", "data", "wire"},
    "facades": {"foundation", "core", "data", "wire", "facades"},
    "sink": {"foundation", "facades", "sink"},
    "spark": {"foundation", "facades", "sink", "spark"},
    "dualwrite": {"foundation", "facades", "sink", "dualwrite"},
    "audit": {"foundation", "facades", "audit"},
    "cli": {"foundation", "facades", "sink", "spark", "audit", "dualwrite", "cli"},
    # what users' own tests call (start a broker, read back with read_committed, the fixtures) and nothing more
    "testing": {"foundation", "wire", "testing"},
    "api": {"foundation", "facades", "sink"},
}
#: the sans-IO core neither sleeps, connects nor reads a clock; of kafka-python it uses the error-code table only
CORE_FORBIDDEN = ("time", "socket", "select", "threading", "asyncio", "concurrent", "kafka")
CORE_ALLOWED = ("kafka.errors",)


def layer_of(module: str) -> str:
    matches = [(len(prefix), layer) for layer, prefixes in LAYERS.items() for prefix in prefixes
               if module == prefix or module.startswith(prefix + ".")]
    assert matches, f"{module} is in no layer"
    return max(matches)[1]


def modules(root: pathlib.Path = SRC) -> list[tuple[str, pathlib.Path]]:
    found = []
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found.append((".".join(parts), path))
    return found


def imports(module: str, path: pathlib.Path) -> list[str]:
    """Every module ``module`` imports, at any depth of its code (``from a import b`` counts as ``a.b`` when that is
    a module)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    known = {name for name, _ in modules()}
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                found.append(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return found


MODULES = modules()


@pytest.mark.parametrize(("module", "path"), MODULES, ids=[m for m, _ in MODULES])
def test_imports_go_down_never_up_or_around(module, path):
    layer = layer_of(module)
    wrong = [target for target in imports(module, path)
             if target.split(".")[0] in ("kafka2pc", "pyspark_kafka2pc") and layer_of(target) not in MAY_IMPORT[layer]]
    assert wrong == [], f"{module} ({layer}) may not import {wrong}"


@pytest.mark.parametrize(("module", "path"), [(m, p) for m, p in MODULES if layer_of(m) == "core"],
                         ids=[m for m, _ in MODULES if layer_of(m) == "core"])
def test_the_core_does_no_io(module, path):
    wrong = [target for target in imports(module, path)
             if target.split(".")[0] in CORE_FORBIDDEN and not target.startswith(CORE_ALLOWED)]
    assert wrong == [], f"{module} imports {wrong}"


#: the dual write's sans-IO modules: the protocol decides, its edges (blocking.py, aio.py) do the I/O
DUAL_WRITE_SANS_IO = ("kafka2pc.dualwrite.actions", "kafka2pc.dualwrite.protocol", "kafka2pc.dualwrite.state_table",
                      "kafka2pc.dualwrite.recovery", "kafka2pc.dualwrite.outcome",
                      "kafka2pc.dualwrite.lease_statements", "kafka2pc.dualwrite.slots", "kafka2pc.dualwrite.upkeep")


@pytest.mark.parametrize(("module", "path"), [(m, p) for m, p in MODULES if m in DUAL_WRITE_SANS_IO],
                         ids=[m for m, _ in MODULES if m in DUAL_WRITE_SANS_IO])
def test_the_dual_write_protocol_does_no_io(module, path):
    wrong = [target for target in imports(module, path)
             if target.split(".")[0] in CORE_FORBIDDEN or target in ("kafka2pc.dualwrite.blocking",
                                                                     "kafka2pc.dualwrite.aio",
                                                                     "kafka2pc.dualwrite.aio_edge")]
    assert wrong == [], f"{module} imports {wrong}"


def test_the_runtime_never_imports_the_harness():
    """kafka2pc_harness is not installed with kafka2pc: no module of the runtime wheel may import it."""
    wrong = [(module, target) for module, path in MODULES for target in imports(module, path)
             if target.split(".")[0] == "kafka2pc_harness"]
    assert wrong == []


HARNESS_MODULES = modules(HARNESS)


@pytest.mark.parametrize(("module", "path"), HARNESS_MODULES, ids=[m for m, _ in HARNESS_MODULES])
def test_the_harness_uses_kafka2pc_as_users_do(module, path):
    """The harness imports kafka2pc's public packages (kafka2pc.testing among them), never its private layers."""
    wrong = [target for target in imports(module, path)
             if target.split(".")[0] == "kafka2pc" and layer_of(target) in ("core", "data", "wire")]
    assert wrong == [], f"{module} may not import {wrong}"


def test_the_rules_can_fail():
    """A module that imported upward would be caught (the check is not vacuous)."""
    assert layer_of("kafka2pc._core.producer_core") == "core"
    assert "wire" not in MAY_IMPORT["core"] and "core" not in MAY_IMPORT["sink"]
    assert layer_of("kafka2pc.sink.committer") == "sink" and layer_of("kafka2pc.cluster") == "facades"
    assert layer_of("kafka2pc.testing.verify") == "testing" and "sink" not in MAY_IMPORT["testing"]


def test_private_means_named_so():
    """Every module outside the public packages and facades is in a package whose name starts with '_'."""
    public = {"kafka2pc", "pyspark_kafka2pc"} | {p for layer in ("foundation", "facades") for p in LAYERS[layer]}
    public_packages = ("kafka2pc.config", "kafka2pc.sink", "kafka2pc.spark", "kafka2pc.dualwrite", "kafka2pc.audit",
                       "kafka2pc.cli", "kafka2pc.testing", "kafka2pc._core", "kafka2pc._data", "kafka2pc._wire")
    stray = [m for m, _ in MODULES if m not in public and not m.startswith(public_packages)]
    assert stray == []
