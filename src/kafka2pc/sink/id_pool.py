"""The transactional ids one subtask has started and not seen released: a frozen, JSON-serializable value."""

from __future__ import annotations

import json
from typing import Any

import attrs

from kafka2pc.errors import ConfigError, IdPoolExhaustedError
from kafka2pc.sink.naming import TransactionalIdGrammar, TransactionNamingStrategy

DEFAULT_MAX_LIVE_IDS = 16


def _sorted_tuple(values: Any) -> tuple[int, ...]:
    return tuple(sorted(int(v) for v in values))


def _non_negative(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(attribute.name, f"must be an integer >= 0, got {value!r}")


@attrs.frozen
class TransactionalIdPool:
    """Counters of ``<prefix>-<subtask>-<counter>`` ids: ``in_use`` (a transaction may be open or prepared on them)
    and ``free`` (completed; POOLING reuses them). Every operation returns a new pool."""

    prefix: str
    subtask: int = attrs.field(validator=_non_negative)
    strategy: TransactionNamingStrategy = TransactionNamingStrategy.POOLING
    max_live: int = attrs.field(default=DEFAULT_MAX_LIVE_IDS, validator=_non_negative)
    next_counter: int = attrs.field(default=0, validator=_non_negative)
    in_use: tuple[int, ...] = attrs.field(default=(), converter=_sorted_tuple)
    free: tuple[int, ...] = attrs.field(default=(), converter=_sorted_tuple)

    def __attrs_post_init__(self) -> None:
        TransactionalIdGrammar(self.prefix)  # validates the prefix
        if self.max_live < 1:
            raise ConfigError("max_live", "must be >= 1")
        if set(self.in_use) & set(self.free):
            raise ValueError(f"counters both in use and free: {sorted(set(self.in_use) & set(self.free))}")

    @property
    def grammar(self) -> TransactionalIdGrammar:
        """The id grammar of this pool's prefix."""
        return TransactionalIdGrammar(self.prefix)

    def id_of(self, counter: int) -> str:
        """The transactional id of ``counter``."""
        return self.grammar.format(self.subtask, counter)

    @property
    def known_ids(self) -> list[str]:
        """Every id this pool has started and still tracks."""
        return [self.id_of(c) for c in sorted({*self.in_use, *self.free})]

    def acquire(self) -> tuple[TransactionalIdPool, str]:
        """Take an id for a new transaction: the lowest free one (POOLING) or a new one."""
        if len(self.in_use) >= self.max_live:
            raise IdPoolExhaustedError(
                f"subtask {self.subtask} of {self.prefix!r} already has {len(self.in_use)} transactional ids in "
                f"use (max {self.max_live}): prepared transactions are not being completed")
        if self.strategy is TransactionNamingStrategy.POOLING and self.free:
            counter, rest = self.free[0], self.free[1:]
            return attrs.evolve(self, in_use=(*self.in_use, counter), free=rest), self.id_of(counter)
        counter = self.next_counter
        return attrs.evolve(self, in_use=(*self.in_use, counter), next_counter=counter + 1), self.id_of(counter)

    def release(self, transactional_id: str) -> TransactionalIdPool:
        """Return an id whose transaction is completed (committed or aborted)."""
        parsed = self.grammar.parse(transactional_id)
        if parsed is None or parsed[0] != self.subtask:
            raise ValueError(f"{transactional_id!r} is not an id of subtask {self.subtask} of {self.prefix!r}")
        counter = parsed[1]
        in_use = tuple(c for c in self.in_use if c != counter)
        free = self.free
        if self.strategy is TransactionNamingStrategy.POOLING and counter not in free:
            free = (*free, counter)
        return attrs.evolve(self, in_use=in_use, free=free, next_counter=max(self.next_counter, counter + 1))

    def release_all(self) -> TransactionalIdPool:
        """After recovery: nothing is open any more, every tracked id is free."""
        pool = self
        for transactional_id in [self.id_of(c) for c in self.in_use]:
            pool = pool.release(transactional_id)
        return pool

    def adopt(self, transactional_ids: list[str]) -> TransactionalIdPool:
        """Track ids of this subtask found on the broker (say, by ListTransactions) as free, so they are reused."""
        pool = self
        for transactional_id in transactional_ids:
            parsed = self.grammar.parse(transactional_id)
            if parsed is None or parsed[0] != self.subtask:
                continue
            counter = parsed[1]
            if counter not in pool.in_use and counter not in pool.free:
                free = (*pool.free, counter) if self.strategy is TransactionNamingStrategy.POOLING else pool.free
                pool = attrs.evolve(pool, free=free, next_counter=max(pool.next_counter, counter + 1))
        return pool

    def to_json(self) -> str:
        """The pool as a JSON string."""
        return json.dumps({"prefix": self.prefix, "subtask": self.subtask, "strategy": self.strategy.value,
                           "max_live": self.max_live, "next_counter": self.next_counter,
                           "in_use": list(self.in_use), "free": list(self.free)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TransactionalIdPool:
        """The inverse of :meth:`to_json`."""
        data = json.loads(text)
        return cls(prefix=data["prefix"], subtask=data["subtask"],
                   strategy=TransactionNamingStrategy(data["strategy"]), max_live=data["max_live"],
                   next_counter=data["next_counter"], in_use=data["in_use"], free=data["free"])
