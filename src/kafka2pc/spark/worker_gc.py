"""The garbage collection of Spark's reused Python workers.

A reused Python worker (``spark.python.worker.reuse``, Spark's default) runs a full ``gc.collect()`` after every
task and every driver-side call (pyspark's ``daemon.py``), over every object the process holds. The modules of
kafka2pc and kafka-python triple what that collection walks: 11.6 ms with pyspark and pyarrow imported, 38 ms once
``kafka2pc.spark.writers`` is (docs/performance.md). A worker runs its tasks one after another, so that time came
between each task and the next.

So the first kafka2pc call in a reused worker freezes the objects alive then (:func:`gc.freeze`): later collections
skip them. Those objects are freed by reference counting as before; only cycles among them are no longer collected,
once per process. ``KAFKA2PC_SPARK_GC_FREEZE=0`` in the workers' environment (``spark.executorEnv.*``) turns it off.
"""

from __future__ import annotations

import gc
import logging
import os

log = logging.getLogger(__name__)

#: pyspark's daemon reads it: set (by Spark) in workers that run one task after another, collecting after each
REUSE_VARIABLE = "SPARK_REUSE_WORKER"
#: ``0`` turns the freeze off
SWITCH_VARIABLE = "KAFKA2PC_SPARK_GC_FREEZE"

_frozen = False


def freeze_once() -> bool:
    """Freeze what is alive now, once per process, in a reused Spark worker whose collector is on; whether this
    call froze."""
    global _frozen  # noqa: PLW0603 - once per process
    if _frozen or not os.environ.get(REUSE_VARIABLE) or os.environ.get(SWITCH_VARIABLE) == "0" \
            or not gc.isenabled():
        return False
    gc.freeze()
    _frozen = True
    log.debug("froze %d objects: the collections pyspark runs after each task skip them", gc.get_freeze_count())
    return True
