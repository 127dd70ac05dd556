"""Where a record's id (and group) is: its key, or a field of its JSON value."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

import attrs

_DECIMAL = re.compile(r"-?[0-9]+")


def _field(document: object, path: Sequence[str]) -> object:
    for name in path:
        if not isinstance(document, dict) or name not in document:
            return None
        document = document[name]
    return document


@attrs.frozen
class RecordDecoder:
    """Where a record's id (and group) is: the key as a decimal integer, or an integer field of the JSON value
    (``a.b`` for nested fields)."""

    id_field: str | None = None
    group_field: str | None = None

    def decode(self, key: bytes | None, value: bytes | None) -> tuple[int, str | None] | None:
        """(id, group), or None when either cannot be read."""
        document: object = None
        if self.id_field is not None or self.group_field is not None:
            try:
                document = json.loads(value) if value is not None else None
            except ValueError:  # not JSON, or not UTF-8
                return None
        if self.id_field is None:
            text = key.decode("ascii", "replace") if key is not None else ""
            record_id: object = int(text) if _DECIMAL.fullmatch(text) else None
        else:
            record_id = _field(document, self.id_field.split("."))
        if not isinstance(record_id, int) or isinstance(record_id, bool):
            return None
        if self.group_field is None:
            return record_id, None
        group = _field(document, self.group_field.split("."))
        if group is None or isinstance(group, dict | list):
            return None
        return record_id, group if isinstance(group, str) else json.dumps(group)
