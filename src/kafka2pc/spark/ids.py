"""Which transactional id a task attempt writes with: ``<prefix>-<partition>-<counter>``.

No two attempts that can be alive at once may share an id — a producer's InitProducerId aborts whatever transaction
its id has open, prepared or not. Attempts of one partition differ by attempt number (retries, speculation), and
consecutive checkpoints use alternating counters, so an attempt never shares an id with a live one of the next
checkpoint. A stage re-attempt can repeat an attempt number: the task checks the id is free before it starts and
fails (to be retried under the next attempt number) if it is not. See docs/spark.md.
"""

from __future__ import annotations

from kafka2pc.sink.naming import TransactionNamingStrategy

#: attempts of one partition that can hold an id at once, per checkpoint
SLOTS = 4


def counter(strategy: TransactionNamingStrategy, checkpoint: int, attempt: int) -> int:
    """The counter of the id of ``attempt`` in ``checkpoint``. POOLING reuses 2 x SLOTS ids per partition for the
    whole life of the query; INCREMENTING gives every checkpoint its own."""
    slot = attempt % SLOTS
    if strategy is TransactionNamingStrategy.POOLING:
        return (checkpoint % 2) * SLOTS + slot
    return checkpoint * SLOTS + slot
