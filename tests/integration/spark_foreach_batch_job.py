"""examples/spark_foreach_batch.py with a test hook: ``--kill-after-save N`` SIGKILLs the driver's whole process
group right after the N-th ``save()`` of this run returns — before Spark records the micro-batch as done, so the
next run replays it. Every save prints ``saved batch <id>``."""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import sys
from pathlib import Path
from typing import Any

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spark_foreach_batch.py"


def main() -> int:
    """Parse the example's arguments plus the hook, and run the example with the hook around its write."""
    spec = importlib.util.spec_from_file_location("spark_foreach_batch", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    hook = argparse.ArgumentParser(add_help=False)
    hook.add_argument("--kill-after-save", type=int, default=0)
    hook_args, rest = hook.parse_known_args()
    args = example.parse(rest)
    write = example.batch_writer(args)
    saves = 0

    def write_then_maybe_die(batch: Any, batch_id: int) -> None:
        nonlocal saves
        write(batch, batch_id)
        saves += 1
        print(f"saved batch {batch_id}", flush=True)
        if saves == hook_args.kill_after_save:
            os.killpg(os.getpgid(0), signal.SIGKILL)

    return int(example.run(args, write_then_maybe_die))


if __name__ == "__main__":
    sys.exit(main())
