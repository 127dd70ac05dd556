"""The garbage collection of Spark's reused Python workers.

A reused Python worker (``spark.python.worker.reuse``, Spark's default) runs a full ``gc.collect()`` after every
task and every driver-side call (pyspark's ``daemon.py``), over every object the process holds. The modules of
kafka2pc and kafka-python triple what that collection walks: 11.6 ms with pyspark and pyarrow imported, 38 ms once
``kafka2pc.spark.writers`` is (Python 3.11; docs/performance.md). A worker runs its tasks one after another, so that
time came between each task and the next.

So the first kafka2pc call in a reused worker (a task's, or the driver side's planning or commit) freezes every object
alive in that process then (:func:`gc.freeze`), whoever made it: later collections skip them. They are still freed
by reference counting; only cycles among them are no longer collected, for the life of the worker. Objects made
later are collected as before. ``KAFKA2PC_SPARK_GC_FREEZE`` set to ``0``, ``false``, ``off`` or ``no`` in the workers'
environment turns it off (docs/spark.md says where to set it for the driver side's workers too).
"""

from __future__ import annotations

import gc
import logging
import os

log = logging.getLogger(__name__)

#: pyspark's daemon reads it: set (by Spark) in workers that run one task after another, collecting after each
REUSE_VARIABLE = "SPARK_REUSE_WORKER"
#: ``0``, ``false``, ``off`` or ``no`` turns the freeze off
SWITCH_VARIABLE = "KAFKA2PC_SPARK_GC_FREEZE"
_OFF = frozenset({"0", "false", "off", "no"})

_frozen = False


def freeze_once() -> bool:
    """Freeze what is alive now, once per process, in a reused Spark worker whose collector is on; whether this
    call froze."""
    global _frozen  # noqa: PLW0603 - once per process
    if _frozen or not os.environ.get(REUSE_VARIABLE) or os.environ.get(SWITCH_VARIABLE, "").strip().lower() in _OFF \
            or not gc.isenabled():
        return False
    gc.freeze()
    _frozen = True
    log.info("froze the %d objects alive in this Spark Python worker (pid %d): the collection pyspark runs after each "
             "task skips them (%s=0 turns this off)", gc.get_freeze_count(), os.getpid(), SWITCH_VARIABLE)
    return True
