"""The one retry policy: how often and how long to try again, with backoff and jitter.

An immutable value, after urllib3's ``Retry``: :meth:`Retry.started` begins a series of tries and :meth:`Retry.next`
returns the value of the next try (its :attr:`~Retry.delay_s` says how long to wait first), or None when the
policy allows no more. Time is passed in (``now``, a monotonic clock reading), never read here: the sans-IO
machines get it from their driver, the I/O edge from its clock. Without ``now`` only the count limits.
"""

from __future__ import annotations

import random
from typing import Any

import attrs


def _non_negative(instance: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    if value is not None and value < 0:
        raise ValueError(f"{attribute.name} must be >= 0, got {value!r}")


@attrs.frozen
class Retry:
    """A retry policy, and how far one series of tries has got.

    ``total``: tries after the first, at most (None: no count limit). ``timeout_s``: no try starts later than this
    after the series started (None: no time limit). The n-th retry waits ``backoff_s * factor ** (n - 1)``, at most
    ``max_backoff_s``, less a random share of up to ``jitter`` of it (so that many clients retrying at once spread
    out)."""

    total: int | None = attrs.field(default=None, validator=_non_negative)
    timeout_s: float | None = attrs.field(default=None, validator=_non_negative)
    backoff_s: float = attrs.field(default=0.05, validator=_non_negative)
    factor: float = attrs.field(default=2.0, validator=_non_negative)
    max_backoff_s: float = attrs.field(default=1.0, validator=_non_negative)
    jitter: float = attrs.field(default=0.1, validator=_non_negative)
    #: retries made so far in this series
    tries: int = 0
    #: when this series must end (monotonic seconds), when both ``timeout_s`` and a start time were given
    deadline: float | None = None
    #: how long to wait before the try this value stands for
    delay_s: float = 0.0

    def started(self, now: float | None = None) -> Retry:
        """A new series of tries, starting ``now``."""
        deadline = None if self.timeout_s is None or now is None else now + self.timeout_s
        return attrs.evolve(self, tries=0, deadline=deadline, delay_s=0.0)

    def next(self, now: float | None = None) -> Retry | None:
        """The next try, or None when the policy allows no more (``now``: to check the time limit)."""
        if self.total is not None and self.tries >= self.total:
            return None
        nominal = min(self.max_backoff_s, self.backoff_s * self.factor ** self.tries)
        delay = nominal * (1.0 - self.jitter * random.random())
        if self.deadline is not None and now is not None and now + delay > self.deadline:
            return None
        return attrs.evolve(self, tries=self.tries + 1, delay_s=delay)

    def describe(self) -> str:
        """The limits, for messages: e.g. "within 60 s" or "after 20 tries"."""
        if self.timeout_s is not None:
            return f"within {self.timeout_s:g} s"
        return f"after {self.tries + 1} tries"
