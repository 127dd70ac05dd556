"""Transactional ids of the exact form ``<prefix>-<subtask>-<counter>``, and how counters are chosen."""

from __future__ import annotations

import enum
import re

import attrs

from kafka2pc.errors import ConfigError

_PREFIX = re.compile(r"[A-Za-z0-9._]([A-Za-z0-9._-]{0,198}[A-Za-z0-9._])?")
_DECIMAL = r"(0|[1-9][0-9]{0,9})"


class TransactionNamingStrategy(enum.Enum):
    """How a subtask picks the counter of its next transactional id (FLIP-511's option of the same name)."""

    #: reuse ids whose transactions are completed; about 3 ids per subtask in steady state (the default)
    POOLING = "pooling"
    #: a new id for every transaction; predictable names, but the broker keeps every one for
    #: transactional.id.expiration.ms (7 days by default)
    INCREMENTING = "incrementing"


def _validate_prefix(instance: TransactionalIdGrammar, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not _PREFIX.fullmatch(value):
        raise ConfigError("transactional.id.prefix",
                          f"{value!r} must be 1-200 characters of A-Z a-z 0-9 . _ - that neither start nor end "
                          "with '-'")


@attrs.frozen
class TransactionalIdGrammar:
    """The ids of one prefix. Parsing is exact: for prefix ``job-1``, ``job-1-0-3`` belongs to it while
    ``job-10-0-3``, ``job-1x-0-0`` and ``job-1-0-03`` do not."""

    prefix: str = attrs.field(validator=_validate_prefix)

    def format(self, subtask: int, counter: int) -> str:
        """The id of ``counter`` for ``subtask``."""
        if subtask < 0 or counter < 0:
            raise ValueError(f"subtask and counter must be >= 0, got {subtask}, {counter}")
        return f"{self.prefix}-{subtask}-{counter}"

    @property
    def pattern(self) -> str:
        """A regular expression matching exactly this prefix's ids (Java- and Python-compatible)."""
        return re.escape(self.prefix).replace("\\-", "-") + f"-{_DECIMAL}-{_DECIMAL}"

    def parse(self, transactional_id: str) -> tuple[int, int] | None:
        """(subtask, counter) of an id of this prefix; None for any other id."""
        match = re.fullmatch(self.pattern, transactional_id)
        if match is None:
            return None
        return int(match.group(1)), int(match.group(2))

    def owns(self, transactional_id: str) -> bool:
        """Whether ``transactional_id`` is an id of this prefix."""
        return self.parse(transactional_id) is not None
