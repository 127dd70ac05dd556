"""Transactional ids of the exact form ``<prefix>-<subtask>-<counter>``, and how counters are chosen."""

from __future__ import annotations

import enum
import re

import attrs

from kafka2pc.errors import ConfigError

_PREFIX = re.compile(r"[A-Za-z0-9._]([A-Za-z0-9._-]{0,198}[A-Za-z0-9._])?")
_DECIMAL = r"(0|[1-9][0-9]{0,9})"


#: attempts of one subtask that can hold an id at once, per checkpoint (see TransactionNamingStrategy.attempt_counter)
ATTEMPT_SLOTS = 4


class TransactionNamingStrategy(enum.Enum):
    """How a subtask picks the counter of its next transactional id (FLIP-511's option of the same name)."""

    #: reuse ids whose transactions are completed; about 3 ids per subtask in steady state (the default)
    POOLING = "pooling"
    #: a new id for every transaction; predictable names, but the broker keeps every one for
    #: transactional.id.expiration.ms (7 days by default)
    INCREMENTING = "incrementing"

    def attempt_counter(self, checkpoint: int, attempt: int) -> int:
        """The counter of the id of ``attempt`` in ``checkpoint``, for engines whose attempts keep no pool (a Spark
        task starts afresh every time).

        No two attempts that can be alive at once may share an id — a producer's InitProducerId aborts whatever
        transaction its id has open, prepared or not. Attempts of one subtask differ by attempt number (retries,
        speculation), and consecutive checkpoints use alternating counters, so an attempt never shares an id with a
        live one of the next checkpoint. POOLING reuses 2 x :data:`ATTEMPT_SLOTS` ids per subtask for the whole life
        of the query; INCREMENTING gives every checkpoint its own."""
        slot = attempt % ATTEMPT_SLOTS
        if self is TransactionNamingStrategy.POOLING:
            return (checkpoint % 2) * ATTEMPT_SLOTS + slot
        return checkpoint * ATTEMPT_SLOTS + slot


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
