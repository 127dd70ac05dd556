"""The docs point at code and tests that exist: every test named in docs/decisions.md is there."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_every_test_docs_decisions_names_exists():
    text = (ROOT / "docs" / "decisions.md").read_text()
    named = re.findall(r"`((?:unit|model|integration)/[a-z0-9_/]+\.py)(?:::(test_[a-z0-9_]+))?", text)
    assert len(named) > 30
    missing = []
    for path, name in named:
        source = ROOT / "tests" / path
        if not source.exists() or (name and f"def {name}(" not in source.read_text()):
            missing.append(f"{path}::{name}")
    every_test = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("test_*.py"))
    missing += [name for name in re.findall(r"`::(test_[a-z0-9_]+)`", text) if f"def {name}(" not in every_test]
    assert missing == []


def test_every_module_docs_design_draws_exists():
    text = (ROOT / "docs" / "design.md").read_text()
    tree = text[text.index("```\nsrc/kafka2pc/"):text.index("```", text.index("```\nsrc/kafka2pc/") + 3)]
    drawn = set(re.findall(r"([a-z_]+\.py)", tree))
    on_disk = {p.name for p in (ROOT / "src" / "kafka2pc").glob("*.py")} | \
        {p.name for d in ("_core", "_data", "_wire", "config") for p in (ROOT / "src" / "kafka2pc" / d).glob("*.py")}
    assert drawn <= on_disk and on_disk - drawn <= {"__init__.py", "py.typed"}
