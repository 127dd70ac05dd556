"""The docs point at code, tests and files that exist: every test and every function docs/decisions.md names, the
names in design.md's module map, and every relative link of the docs and the README."""

import ast
import functools
import importlib.util
import pathlib
import re
import urllib.parse

ROOT = pathlib.Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "kafka2pc"


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


# --- names of functions, classes and methods --------------------------------------------------------------------

class _Module:
    """What one source file defines: every name bound in it, and each class's own names and bases."""

    def __init__(self, path: pathlib.Path) -> None:
        self.names: set[str] = set()
        self.classes: dict[str, tuple[set[str], list[str]]] = {}
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                own = {n.name for n in node.body
                       if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
                for n in ast.walk(node):
                    own |= _bound(n)
                    if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
                        own.add(n.attr)
                bases = [b.id if isinstance(b, ast.Name) else b.attr for b in node.bases
                         if isinstance(b, ast.Name | ast.Attribute)]
                self.classes[node.name] = (own, bases)
            self.names |= _bound(node)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                self.names.add(node.name)
            if isinstance(node, ast.arg):
                self.names.add(node.arg)


def _bound(node: ast.AST) -> set[str]:
    """Names an assignment (or an enum member, an attrs field, a for target) binds."""
    if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign | ast.For):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return set()


@functools.cache
def _modules() -> dict[str, _Module]:
    """Every module under src/kafka2pc by its path there (``_core/judge.py``)."""
    return {p.relative_to(SRC).as_posix(): _Module(p) for p in SRC.rglob("*.py")}


def _module_named(path: str) -> str | None:
    """The one module a doc's path names: a path under src/kafka2pc, or a unique file name (``state_table.py``)."""
    found = [m for m in _modules() if m == path or m.endswith(f"/{path}")]
    return found[0] if len(found) == 1 else None


def _members(class_name: str) -> set[str] | None:
    """Every name a class of kafka2pc defines or inherits from another class of kafka2pc; None for no such class."""
    own = [m.classes[class_name] for m in _modules().values() if class_name in m.classes]
    if not own:
        return None
    names = set().union(*(o[0] for o in own))
    for base in {b for o in own for b in o[1]} - {class_name}:
        names |= _members(base) or set()
    return names


def _check_name(token: str, module: str | None) -> str | None:
    """Why ``token`` (a backticked name, ``Class.method``, ``module.NAME`` or ``function``) names nothing; None when
    it exists. ``module``: the module a path before it in the same cell named."""
    first, _, rest = token.partition(".")
    if rest:
        members = _members(first)
        if members is not None:
            return None if rest.split(".")[0] in members else f"{first} has no {rest}"
        named = _module_named(f"{first}.py")
        if named is not None:
            return None if rest.split(".")[0] in _modules()[named].names else f"{named} defines no {rest}"
        return f"neither a class nor a module: {first}"
    if module is not None:
        return None if token in _modules()[module].names else f"{module} defines no {token}"
    return None if any(token in m.names for m in _modules().values()) else f"not defined anywhere: {token}"


def names_that_do_not_exist(decided_by: str) -> list[str]:
    """What the "decided by" cell of a decisions.md row names that src/kafka2pc does not define.

    Every backticked path must be a module, and the name right after it (``path.py` `name``, and names joined to
    that one by " / ") a name that module defines: a function, a class, an argument, an attribute. Elsewhere in the
    cell ``Class.member`` must be a member of that class, ``module.NAME`` a name of that module, and a bare name
    defined somewhere in src/kafka2pc. Config keys (``max.block.ms``) and SQL are not names and are skipped."""
    wrong: list[str] = []
    module = None
    for between, quoted in re.findall(r"([^`]*)`([^`]+)`", decided_by):
        token = quoted.split("(")[0].strip()
        if module is not None and between.strip() not in ("", "/"):
            module = None  # the path's name ended: what follows is named in prose, found anywhere
        if token.endswith(".py"):
            module = _module_named(token)
            if module is None:
                wrong.append(f"no such module: {token}")
            continue
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", token):
            module = None
            continue
        head = token.split(".")[0]
        if "." in token and token.islower() and _members(head) is None and _module_named(f"{head}.py") is None:
            continue  # a config key such as max.block.ms
        why = _check_name(token, module)
        if why is not None:
            wrong.append(why)
    return wrong


def _decided_by_cells() -> list[str]:
    rows = [line for line in (ROOT / "docs" / "decisions.md").read_text().splitlines() if line.startswith("| ")]
    return [row.split(" | ")[1] for row in rows if not row.startswith(("| situation", "|---"))]


def test_every_function_docs_decisions_names_exists():
    cells = _decided_by_cells()
    assert len(cells) > 60
    assert sum(len(re.findall(r"`[^`]+`", cell)) for cell in cells) > 150
    wrong = [f"{why} (in: {cell})" for cell in cells for why in names_that_do_not_exist(cell)]
    assert wrong == []


def test_the_names_check_finds_a_renamed_function():
    assert names_that_do_not_exist("`spark/task.py` `_open`: IdInUseError") == []
    assert names_that_do_not_exist("`spark/task.py` `_wait_until_free`: IdInUseError") == \
        ["spark/task.py defines no _wait_until_free"]
    assert names_that_do_not_exist("`Committer.settled`; `judge.MAX_EPOCH`; `spark/tasks.py`") == \
        ["Committer has no settled", "_core/judge.py defines no MAX_EPOCH", "no such module: spark/tasks.py"]
    assert names_that_do_not_exist("until `max.block.ms` (`FOR UPDATE SKIP LOCKED`)") == []
    assert names_that_do_not_exist("`dualwrite/pool.py` `DualWriterPool.close` / `_start_writers`, `_dropped`") == \
        ["not defined anywhere: _dropped"]
    assert names_that_do_not_exist("`dualwrite/pool.py` `DualWriterPool.transaction` / `plan_upkeep`") == \
        ["dualwrite/pool.py defines no plan_upkeep"]


def module_map_names_that_do_not_exist(design: str) -> tuple[int, list[str]]:
    """How many names design.md's module map gives, and those its modules do not define. Each line of the map is
    ``file.py  Name, other(): what it is``: the names before the colon, and every ``name()``, are checked."""
    tree = design[design.index("```\nsrc/kafka2pc/"):design.index("```", design.index("```\nsrc/kafka2pc/") + 3)]
    folder, checked, wrong = "", 0, []
    for line in tree.splitlines():
        entry = re.search(r"─ ([a-z_]+)(/|\.py)\s+(.*)", line)
        if entry is None:
            continue
        top = line.startswith(("├─", "└─"))
        if entry[2] == "/":
            folder = entry[1] + "/" if top else folder
            continue
        module = ("" if top else folder) + entry[1] + ".py"
        if module not in _modules():
            continue  # test_every_module_docs_design_draws_exists says so
        head = entry[3].split(":")[0] if ":" in entry[3] else ""
        names = [n.strip() for n in re.split(r",| and ", head)]
        if not all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\(\))?", n) for n in names):
            names = []  # a description ("the ONE driver: ..."), not names
        names += re.findall(r"\b([A-Za-z_][A-Za-z0-9_]*)\(\)", entry[3])
        for name in sorted({n.removesuffix("()") for n in names if n}):
            checked += 1
            if name not in _modules()[module].names:
                wrong.append(f"{module} defines no {name}")
    return checked, wrong


def test_every_name_docs_design_module_map_gives_is_defined_in_its_module():
    checked, wrong = module_map_names_that_do_not_exist((ROOT / "docs" / "design.md").read_text())
    assert checked > 20
    assert wrong == []


def test_the_module_map_check_finds_a_renamed_class_and_function():
    design = (ROOT / "docs" / "design.md").read_text()
    renamed = design.replace("│   ├─ judge.py           judge():", "│   ├─ judge.py           judged():") \
        .replace("├─ producer.py            TwoPhaseProducer:", "├─ producer.py            TwoPhaseWriter:")
    assert renamed.count("judged():") == 1 and renamed.count("TwoPhaseWriter:") == 1
    assert module_map_names_that_do_not_exist(renamed)[1] == \
        ["_core/judge.py defines no judged", "producer.py defines no TwoPhaseWriter"]


# --- links -------------------------------------------------------------------------------------------------------

def _documents() -> list[pathlib.Path]:
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]


def broken_links(text: str, folder: pathlib.Path) -> list[str]:
    """The relative links of Markdown ``text`` (``[text](target)``, outside code) kept in ``folder`` that reach no
    file of the repository, or leave it."""
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    text = re.sub(r"`[^`\n]*`", "", text)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL, or an anchor on the same page (mkdocs build --strict checks anchors)
        resolved = (folder / urllib.parse.unquote(target.split("#")[0])).resolve()
        if not resolved.is_relative_to(ROOT) or not resolved.exists():
            broken.append(target)
    return broken


def test_every_relative_link_of_the_docs_reaches_a_file_of_the_repository():
    links, broken = 0, {}
    for document in _documents():
        if document.exists():
            text = document.read_text()
            links += len(re.findall(r"\]\((?![a-z]+:)[^)]+\)", text))
            if found := broken_links(text, document.parent):
                broken[document.relative_to(ROOT).as_posix()] = found
    assert links > 25
    assert broken == {}


def test_the_link_check_finds_a_missing_file_and_a_link_out_of_the_repository():
    docs = ROOT / "docs"
    text = "[a](recovery.md#x) [b](DOMAIN.md) [c](../../outside.md) [d](https://kafka.apache.org) [e](#top)\n" \
        "`[f](nowhere.md)` [g](../README.md) [h](../src/kafka2pc/errors.py) [i](api/missing.md)"
    assert broken_links(text, docs) == ["DOMAIN.md", "../../outside.md", "api/missing.md"]


def test_no_doc_cites_a_document_outside_the_repository():
    """The docs once cited "DOMAIN.md §7" and "the talk's slides", which no reader of the repository has."""
    cited = {}
    for path in [*_documents(), SRC / "dualwrite" / "writer.py"]:
        if path.exists() and (found := re.findall(r"[A-Z]+\.md §|talk's slides|closing note", path.read_text())):
            cited[path.relative_to(ROOT).as_posix()] = found
    assert cited == {}


# --- the docs site ------------------------------------------------------------------------------------------------

def test_each_public_module_has_an_api_page_that_renders_it_by_its_all():
    """The API reference is generated: one page per public module that tests/unit/test_public_api.py pins, each a
    bare ``::: module`` (mkdocs.yml's ``filters: public`` renders what its ``__all__`` holds), never a hand-made list
    of members."""
    pinned = ast.parse((ROOT / "tests" / "unit" / "test_public_api.py").read_text())
    modules = next(ast.literal_eval(node.value) for node in pinned.body
                   if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "PUBLIC_MODULES")
    assert len(modules) >= 6
    pages = sorted(p.read_text().strip() for p in (ROOT / "docs" / "api").glob("*.md"))
    assert pages == sorted(f"::: {module}" for module in modules)
    assert "filters: public" in (ROOT / "mkdocs.yml").read_text()


def test_the_api_pages_show_sphinx_roles_as_code():
    spec = importlib.util.spec_from_file_location("sphinx_roles", ROOT / "docs" / "api" / "sphinx_roles.py")
    assert spec is not None and spec.loader is not None
    roles = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(roles)
    assert roles.plain("a :class:`~kafka2pc.config.ClientConfig`, :mod:`kafka2pc.sink` and :meth:`send`.") == \
        "a `ClientConfig`, `kafka2pc.sink` and `send`."
