"""The public API, pinned. Every public module's exports and the signature of every exported function, class
constructor and public method or property are written out and compared with ``public_api.txt`` beside this file, so
a change to the surface shows up in review as a change to that file. And no public signature names a private type.

After an intended change: ``KAFKA2PC_UPDATE_API_SNAPSHOT=1 pytest tests/unit/test_public_api.py``, then review and
commit the snapshot's diff. docs/integration-api.md describes the surface.
"""

from __future__ import annotations

import difflib
import enum
import functools
import importlib
import inspect
import os
import re
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

#: every public module, each one's objects written out in full the first time one of them exports it
PUBLIC_MODULES = (
    "kafka2pc.errors",
    "kafka2pc.config",
    "kafka2pc.transaction_control",
    "kafka2pc",
    "kafka2pc.sink",
    "kafka2pc.sink.integration",
    "kafka2pc.spark",
    "kafka2pc.dualwrite",
    "kafka2pc.audit",
    "kafka2pc.testing",
    "kafka2pc.testing.verify",
    "kafka2pc.testing.pytest_plugin",
)
SNAPSHOT = Path(__file__).with_name("public_api.txt")
UPDATE_VARIABLE = "KAFKA2PC_UPDATE_API_SNAPSHOT"
HOW_TO_UPDATE = (f"if the change is intended, update the snapshot with `{UPDATE_VARIABLE}=1 pytest "
                 f"tests/unit/test_public_api.py` and commit tests/unit/public_api.txt with it")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def public_names(module: types.ModuleType) -> list[str]:
    """The module's ``__all__``; for a module without one, the public classes and functions it defines."""
    names = getattr(module, "__all__", None)
    if names is not None:
        return list(names)
    return sorted(name for name, value in vars(module).items()
                  if not name.startswith("_") and (inspect.isclass(value) or inspect.isfunction(value))
                  and value.__module__ == module.__name__)


def _is_private_module(module: str) -> bool:
    return any(part.startswith("_") for part in module.split("."))


class _Text:
    """An annotation or default shown exactly as given (``inspect`` would quote a string)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _annotation(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, type) and not typing.get_args(value):
        return value.__qualname__
    return re.sub(r"\b(typing|collections\.abc|kafka2pc(\.\w+)*)\.", "", repr(value))


def _default(value: Any) -> str:
    if value is attrs.NOTHING:
        return "<factory>"
    if isinstance(value, enum.Enum):
        return f"{type(value).__qualname__}.{value.name}"
    return _ADDRESS.sub("", repr(value))


def signature(function: Callable[..., Any]) -> str:
    """``inspect.signature`` with annotations as written and defaults without addresses."""
    try:
        sig = inspect.signature(function)
    except (TypeError, ValueError):
        return "(...)"
    parameters = [parameter.replace(
        annotation=parameter.empty if parameter.annotation is parameter.empty
        else _Text(_annotation(parameter.annotation)),
        default=parameter.empty if parameter.default is parameter.empty else _Text(_default(parameter.default)))
        for parameter in sig.parameters.values()]
    returns = sig.empty if sig.return_annotation is sig.empty else _Text(_annotation(sig.return_annotation))
    return str(sig.replace(parameters=parameters, return_annotation=returns))


def _own_kafka2pc_classes(cls: type, exported: set[int]) -> Iterator[type]:
    """``cls`` and those of its kafka2pc bases whose members are written out nowhere else."""
    for klass in cls.__mro__:
        if klass.__module__.split(".")[0] != "kafka2pc":
            continue
        if klass is cls or id(klass) not in exported:
            yield klass


def _members(cls: type, exported: set[int]) -> list[str]:
    lines: dict[str, str] = {}
    for klass in reversed(list(_own_kafka2pc_classes(cls, exported))):
        for name, member in vars(klass).items():
            if name.startswith("_"):
                continue
            if isinstance(member, property) and member.fget is not None:
                returns = inspect.signature(member.fget).return_annotation
                lines[name] = f"property {name}" + ("" if returns is inspect.Signature.empty
                                                    else f" -> {_annotation(returns)}")
            elif isinstance(member, functools.cached_property):
                lines[name] = f"cached_property {name}{signature(member.func)}"
            elif isinstance(member, classmethod):
                lines[name] = f"classmethod {name}{signature(getattr(cls, name))}"
            elif isinstance(member, staticmethod):
                lines[name] = f"staticmethod {name}{signature(member.__func__)}"
            elif inspect.isfunction(member):
                lines[name] = f"def {name}{signature(member)}"
    return [lines[name] for name in sorted(lines)]


def _constructor(cls: type) -> str | None:
    """The constructor's signature when kafka2pc defines it (not an inherited Exception's or Protocol's)."""
    if issubclass(cls, enum.Enum):
        return None
    for klass in cls.__mro__:
        made = vars(klass).get("__init__") or vars(klass).get("__new__")
        if made is not None:
            ours = attrs.has(klass) or getattr(made, "__module__", "").split(".")[0] == "kafka2pc"
            return f"__init__{signature(cls)}" if ours else None
    return None


def describe_class(cls: type, exported: set[int]) -> list[str]:
    bases = ", ".join(base.__qualname__ for base in cls.__bases__ if base is not object)
    lines = [f"class {cls.__qualname__}" + (f"({bases})" if bases else "")]
    constructor = _constructor(cls)
    if constructor is not None:
        lines.append(f"    {constructor}")
    if issubclass(cls, enum.Enum):
        lines += [f"    {member.name} = {member.value!r}" for member in cls]
    lines += [f"    {line}" for line in _members(cls, exported)]
    return lines


def describe_value(name: str, value: Any) -> str:
    if name == "__version__":
        return f"{name}: str"
    if isinstance(value, (frozenset, set)):
        shown = "{" + ", ".join(repr(item) for item in sorted(value)) + "}"
        return f"{name}: {type(value).__name__} = {shown}"
    if isinstance(value, (str, int, float, bool, tuple)) or value is None:
        return f"{name}: {type(value).__name__} = {value!r}"
    return f"{name}: {_annotation(type(value))}"


def render() -> str:
    """The snapshot's text, as the code stands."""
    modules = {name: importlib.import_module(name) for name in PUBLIC_MODULES}
    exported = {id(getattr(module, name)) for module in modules.values() for name in public_names(module)
                if inspect.isclass(getattr(module, name))}
    home: dict[int, str] = {}
    out: list[str] = []
    for module_name, module in modules.items():
        names = public_names(module)
        out += ["", f"== {module_name}: " + (f"__all__ has {len(names)} names" if hasattr(module, "__all__")
                                              else f"no __all__; the {len(names)} public classes and functions "
                                                   "it defines")]
        for name in sorted(names, key=str.lower):
            value = getattr(module, name)
            if (inspect.isclass(value) or inspect.isfunction(value)) and id(value) in home:
                out.append(f"{name} = {home[id(value)]}")
                continue
            if inspect.isclass(value):
                home[id(value)] = f"{module_name}.{name}"
                out += describe_class(value, exported)
            elif inspect.isfunction(value):
                home[id(value)] = f"{module_name}.{name}"
                out.append(f"def {name}{signature(value)}")
            elif isinstance(value, types.ModuleType):
                out.append(f"module {name}")
            else:
                out.append(describe_value(name, value))
    return "\n".join(out).lstrip("\n") + "\n"


def test_the_public_api_is_the_snapshot():
    current = render()
    if os.environ.get(UPDATE_VARIABLE):
        SNAPSHOT.write_text(current)
        return
    pinned = SNAPSHOT.read_text() if SNAPSHOT.exists() else ""
    if current != pinned:
        diff = "".join(difflib.unified_diff(pinned.splitlines(keepends=True), current.splitlines(keepends=True),
                                            fromfile="tests/unit/public_api.txt (pinned)",
                                            tofile="the public API as the code stands"))
        pytest.fail(f"the public API changed without its snapshot:\n{diff}\n{HOW_TO_UPDATE}", pytrace=False)


# -- no private types ------------------------------------------------------------------------------------------------

def _kinds(annotation: Any) -> Iterator[type]:
    if isinstance(annotation, type):
        yield annotation
    origin = typing.get_origin(annotation)
    if isinstance(origin, type):
        yield origin
    for argument in typing.get_args(annotation):
        yield from _kinds(argument)


def _signatures(obj: Any) -> Iterator[tuple[str, Callable[..., Any]]]:
    """(where, function) of a public function, or of a class's constructor, methods and properties."""
    if inspect.isfunction(obj):
        yield "", obj
        return
    if not inspect.isclass(obj):
        return
    for klass in obj.__mro__:
        if klass.__module__.split(".")[0] != "kafka2pc":
            continue
        for name, member in vars(klass).items():
            if name.startswith("_") and name != "__init__":
                continue
            if isinstance(member, property) and member.fget is not None:
                yield f".{name}", member.fget
            elif isinstance(member, functools.cached_property):
                yield f".{name}", member.func
            elif isinstance(member, (classmethod, staticmethod)):
                yield f".{name}", member.__func__
            elif inspect.isfunction(member):
                yield f".{name}", member


def private_types_in_signatures() -> list[str]:
    """Every type from a private module (or with a private name) that a public signature names, where no public
    module exports it: in a parameter or return of an exported function, constructor, method or property, or in a
    field of a class reached that way. Types reached only as parameters are not followed further (a transport a test
    plugs in is a parameter; what its methods take is the transport's business)."""
    public: set[int] = set()
    queue: list[tuple[str, Any]] = []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in public_names(module):
            value = getattr(module, name)
            public.add(id(value))
            queue.append((f"{module_name}.{name}", value))
    found: set[str] = set()
    seen: set[int] = set()
    while queue:
        where, obj = queue.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        named: list[tuple[str, type, bool]] = []
        if inspect.isclass(obj) and attrs.has(obj):
            for field in attrs.fields(attrs.resolve_types(obj)):
                if not field.name.startswith("_"):
                    named += [(f"{where}.{field.name}", kind, True) for kind in _kinds(field.type)]
        for suffix, function in _signatures(obj):
            for parameter, annotation in typing.get_type_hints(function).items():
                named += [(f"{where}{suffix}({parameter})", kind, parameter == "return")
                          for kind in _kinds(annotation)]
        for place, kind, follow in named:
            if kind.__module__.split(".")[0] != "kafka2pc":
                continue
            if (_is_private_module(kind.__module__) or kind.__name__.startswith("_")) and id(kind) not in public:
                found.add(f"{place}: {kind.__module__}.{kind.__qualname__}")
            if follow:
                queue.append((f"{kind.__module__}.{kind.__qualname__}", kind))
    return sorted(found)


def test_no_public_signature_names_a_private_type():
    found = private_types_in_signatures()
    assert not found, ("public signatures name types no public module exports; export each from the public module "
                       "of what returns it (and document it), or return a public type:\n" + "\n".join(found))


# -- names that moved ------------------------------------------------------------------------------------------------

#: what kafka2pc.sink exported before the integration API had its own module
MOVED_TO_INTEGRATION = ("Committer", "Decision", "DecisionLog", "FileDecisionLog", "PreparedTransaction",
                        "RecoveryReport", "Settlement", "SubtaskWriter", "TransactionNamingStrategy",
                        "TransactionalIdGrammar", "TransactionalIdPool", "recover")


@pytest.mark.parametrize("name", MOVED_TO_INTEGRATION)
def test_a_name_that_moved_to_the_integration_api_still_imports_from_the_sink_with_a_warning(name):
    integration = importlib.import_module("kafka2pc.sink.integration")
    with pytest.warns(DeprecationWarning, match=rf"kafka2pc\.sink\.integration\.{name}\b"):
        moved = getattr(importlib.import_module("kafka2pc.sink"), name)
    assert moved is getattr(integration, name)

