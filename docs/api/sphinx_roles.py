"""A griffe extension for the API pages: kafka2pc's docstrings cross-reference with Sphinx roles
(:class:`~kafka2pc.config.ClientConfig`), which Markdown would show as written; each becomes a code span of the
name Sphinx would show (the last part after a ``~``)."""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|mod|func|meth|attr|exc|data|obj|const):`(~?)([^`]+)`")


def plain(text: str) -> str:
    """``text`` with each Sphinx role replaced by a code span."""
    return _ROLE.sub(lambda m: f"`{m[2].rsplit('.', 1)[-1] if m[1] else m[2]}`", text)


class SphinxRoles(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        todo: list[griffe.Object] = [pkg]
        while todo:
            obj = todo.pop()
            if obj.docstring is not None:
                obj.docstring.value = plain(obj.docstring.value)
            todo += [m for m in obj.members.values() if not m.is_alias]
