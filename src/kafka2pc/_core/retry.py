"""The one retry policy, and every policy and counter of kafka2pc's loops: how often and how long to try again.

:class:`Retry` is an immutable value, after urllib3's ``Retry``: :meth:`Retry.started` begins a series of tries and
:meth:`Retry.next` returns the value of the next try (its :attr:`~Retry.delay_s` says how long to wait first), or
None when the policy allows no more. Time is passed in (``now``, a monotonic clock reading), never read here: the
sans-IO machines get it from their driver, the I/O edge from its clock. Without ``now`` only the count limits.

Below it, every loop's policy, by who runs it. A loop that only counts has ``backoff_s=0`` (it sends at once, after
a look that took a round trip). No loop keeps a count of its own: a new bound is a policy here.
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


# -- every policy, by who runs it --------------------------------------------------------------------------------------

#: coordinator commands that may be sent again (:mod:`~kafka2pc._core.resend`), after a lost answer or a coordinator
#: that moved, loads or is busy; the deadline is the caller's ``max.block.ms`` (or TransactionControl's timeout)
COORDINATOR_RETRY = Retry(timeout_s=60.0, backoff_s=0.05, max_backoff_s=1.0)
#: DescribeTransactions while an end writes its markers, before a begin (a bump, a takeover) gives up: the
#: coordinator is busy for milliseconds (:class:`~kafka2pc._core.looks.Looks` in ``Bumping``, ``Beginning``)
BUSY_LOOKS = Retry(total=19, backoff_s=0.01, max_backoff_s=0.2)
#: DescribeTransactions of a completion (after an error, to learn a fate, around a v1 fence) while the coordinator
#: writes markers, before the completion says it is not settled: 40 looks, under 20 s
END_LOOKS = Retry(total=39, backoff_s=0.01, max_backoff_s=0.5)
#: EndTxn sent again for one goal after a look found the transaction still ongoing at its identity (3 in all),
#: before the completion says it is not settled
END_AGAIN = Retry(total=2, backoff_s=0.0)
#: unanswered requests of a v1 fence (each may have waited a full timeout) looked past, before the abort is
#: reported as not fenced
FENCE_SILENCES = Retry(total=4, backoff_s=0.0)
#: TransactionControl.wait_until_settled: a look every 50 ms; its caller gives the time limit
SETTLE_LOOKS = Retry(backoff_s=0.05, factor=1.0)
#: the I/O edge's reads of cluster metadata and configs (and ListTransactions per broker): a second's backoff at
#: most, for as long as the caller blocks (the client's timeout)
READS = Retry(backoff_s=0.1, max_backoff_s=1.0)
#: a whole ListTransactions fan-out, listed again when the coordinators moved during it or a broker being asked left
#: the cluster (5 in all, a short pause between: leader epochs also grow on an ISR shrink before metadata.version
#: 3.6-IV0, so a flapping follower can look like a move)
LISTING_ROUNDS = Retry(total=4, backoff_s=0.1, max_backoff_s=1.0)
#: the longest pause between Produce retries unless the producer's ``retry.backoff.ms`` is longer (Kafka's default
#: ``retry.backoff.max.ms``)
PRODUCE_MAX_BACKOFF_MS = 1000


def produce_retry(backoff_ms: int, delivery_timeout_ms: int) -> Retry:
    """The data plane's Produce retries: ``retry.backoff.ms`` doubling up to :data:`PRODUCE_MAX_BACKOFF_MS` (or the
    base itself, when that is longer), with Kafka's 20 % jitter, within ``delivery.timeout.ms``."""
    return Retry(timeout_s=delivery_timeout_ms / 1000, backoff_s=backoff_ms / 1000, factor=2.0,
                 max_backoff_s=max(backoff_ms, PRODUCE_MAX_BACKOFF_MS) / 1000, jitter=0.2)
