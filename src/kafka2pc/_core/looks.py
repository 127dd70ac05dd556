"""Looking at a transactional id again while its coordinator is busy: DescribeTransactions at once, then with
backoff, until a :class:`~kafka2pc._core.retry.Retry` policy allows no more."""

from __future__ import annotations

from kafka2pc._core.messages import DescribeTransaction
from kafka2pc._core.retry import BUSY_LOOKS, Retry


class Looks:
    """A series of looks under ``policy``: :meth:`next` gives the next DescribeTransactions, or None once the
    policy allows no more; :attr:`count` is how many were given."""

    def __init__(self, policy: Retry = BUSY_LOOKS):
        self.policy = policy
        self._retry: Retry | None = None
        self.count = 0

    def next(self, now: float | None = None) -> DescribeTransaction | None:
        """The next look (the first without delay), or None when the series is used up."""
        retry = self.policy.started(now) if self._retry is None else self._retry.next(now)
        if retry is None:
            return None
        self._retry = retry
        self.count += 1
        return DescribeTransaction(after_s=retry.delay_s)

    @property
    def left(self) -> bool:
        """Whether the count limit allows another look."""
        total = self.policy.total
        return total is None or self.count <= total
