"""A query's write window: how a task attempt learns that the batch it writes for is over.

Spark hands the driver only the winning attempt of each partition. A speculative loser, an attempt of a lost
executor, or one still running when Spark kills it can open a transaction *after* the driver's end-of-batch cleanup
listed the prefix — and with two-phase commit that transaction never times out: it would pin the LSO until the next
batch's cleanup, and after the last batch (``availableNow``, a stopped query, a batch write) until the next run.

So the driver moves the window — a fresh InitProducerId on the transactional id ``<prefix>-window``, which never
runs a transaction — when it plans a batch and before every cleanup. A task compares the window's producer id and
epoch with those its plan carries — before its InitProducerId, once its first write is acknowledged (the coordinator
then knows its transaction), and after it prepares — and stops once it moved, aborting what it opened. If the
window had not moved when the first write was acknowledged, the move and the cleanup's listing come later and the
listing sees the transaction; if it had, the attempt aborts the transaction itself. What remains is an attempt
killed between its first acknowledged write and the end of its own abort (docs/spark.md).
"""

from __future__ import annotations

from kafka2pc.errors import BatchOverError
from kafka2pc.transaction_control import ObservedTransaction, TransactionControl

#: the suffix of the window's transactional id (outside the ``<prefix>-<partition>-<counter>`` grammar)
SUFFIX = "window"


def window_id(prefix: str) -> str:
    """The transactional id whose producer id and epoch are the query's write window."""
    return f"{prefix}-{SUFFIX}"


def move_window(control: TransactionControl, prefix: str) -> str:
    """Move the window (a fresh InitProducerId, no transaction); returns the new window, as ``str`` of its identity."""
    return str(control.fence(window_id(prefix)))


def check_window(control: TransactionControl, prefix: str, planned: str, attempt: str) -> None:
    """Raise :class:`BatchOverError` if the window is no longer ``planned`` (an empty ``planned`` checks nothing)."""
    if planned:
        check_observed_window(control.describe(window_id(prefix)), planned, attempt)


def check_observed_window(observed: ObservedTransaction | None, planned: str, attempt: str) -> None:
    """:func:`check_window` on a look at the window already taken (``observed``)."""
    if not planned or observed is None:  # every plan creates the window: gone, it expired (expiration.ms)
        return
    if str(observed.identity) != planned:
        raise BatchOverError(f"{attempt}: the batch it writes for is over (the write window moved from {planned} to "
                             f"{observed.identity}): it stops, aborting what it opened")
