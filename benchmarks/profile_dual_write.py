"""Where a dual write's CPU goes: a DualWriterPool on PostgreSQL (a server the harness starts, or --postgres DSN) and
a broker (a local 4.4.0 one, or --bootstrap), ``--transactions`` dual writes (INSERT + 1 record) over ``--writers``
threads after a warm-up; the process's CPU (user + system, every thread) per transaction.

With ``--py-spy FILE``, py-spy samples this process from the end of the warm-up to the end of the run, only the thread
that holds the GIL (``--gil``: Python CPU, not threads waiting on a socket or a condition), into FILE (collapsed
stacks), and the top frames are printed: by thread (kafka-python's IO thread, the request threads), self and
inclusive. A profiled run's CPU figure includes py-spy's interruptions: take CPU per transaction from a run without it.

    python benchmarks/profile_dual_write.py [--writers 8] [--transactions 3000] [--warmup 200]
                                            [--py-spy stacks.txt] [--top 20] [--bootstrap HOST:PORT] [--postgres DSN]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
from dual_write import postgres  # benchmarks/ is the script's folder: on sys.path

from kafka2pc.dualwrite import DualWriterPool
from kafka2pc.testing.provider import bootstrap_or_local
from kafka2pc.testing.verify import create_topic

#: a sample's thread, by the frames it starts with
IO_THREAD, REQUEST_THREAD = "NetworkSelector.run_forever", "main.<locals>.write ("
_SITE = re.compile(r".*/(site-packages|src|lib/python3[.][0-9]+)/")


def _frame(raw: str) -> str:
    """``fn (path:line)`` -> ``fn (module path)``: one entry per function, the line dropped."""
    match = re.match(r"(.*?) \((.*?):\d+\)", raw)
    if not match:
        return raw
    function, path = match.groups()
    return f"{function} ({_SITE.sub('', path)})"


def summarize(stacks: Path, top: int, caller: str = REQUEST_THREAD) -> str:
    """The top frames of py-spy's collapsed stacks: share of the samples by thread (kafka-python's IO thread, the
    threads running ``caller``, the rest), then self and inclusive."""
    own, inclusive, threads = collections.Counter[str](), collections.Counter[str](), collections.Counter[str]()
    total = 0
    for line in stacks.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        samples = int(count)
        frames = [_frame(raw) for raw in stack.split(";")]
        total += samples
        own[frames[-1]] += samples
        inclusive.update({frame: samples for frame in set(frames)})
        threads["kafka-python's IO thread" if any(f.startswith(IO_THREAD) for f in frames) else
                "the caller's threads" if any(f.startswith(caller) for f in frames) else "other"] += samples
    if not total:
        return "no samples"
    lines = [f"{total} samples (GIL held)", "by thread:"]
    lines += [f"  {100 * n / total:5.1f} %  {name}" for name, n in threads.most_common()]
    lines.append("self:")
    lines += [f"  {100 * n / total:5.1f} %  {name}" for name, n in own.most_common(top)]
    lines.append("inclusive:")
    lines += [f"  {100 * n / total:5.1f} %  {name}" for name, n in inclusive.most_common(top * 2)]
    return "\n".join(lines)


@contextlib.contextmanager
def sampled(path: Path | None) -> Iterator[None]:
    """py-spy recording this process while the block runs (nothing when ``path`` is None)."""
    if path is None:
        yield
        return
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    process = subprocess.Popen([spy, "record", "--pid", str(os.getpid()), "--gil", "--rate", "250",
                                "--format", "raw", "--output", str(path)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)  # py-spy attached
    try:
        yield
    finally:
        process.send_signal(signal.SIGINT)
        _, errors = process.communicate(timeout=60)
        if process.returncode not in (0, -signal.SIGINT) or not path.exists():
            raise SystemExit(f"py-spy failed ({process.returncode}): {errors.decode()[-500:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--transactions", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--py-spy", type=Path, dest="py_spy")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--bootstrap")
    parser.add_argument("--postgres")
    args = parser.parse_args()
    with bootstrap_or_local(args.bootstrap) as bootstrap, postgres(args.postgres) as dsn:
        topic = create_topic(bootstrap, partitions=3)
        table = f"orders_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(dsn, autocommit=True) as setup:
            setup.execute(f"CREATE TABLE {table} (id BIGINT PRIMARY KEY, amount INT NOT NULL)")
        pool = DualWriterPool(lambda: psycopg.connect(dsn), {
            "bootstrap.servers": bootstrap, "transactional.id": f"prof{uuid.uuid4().hex[:6]}", "linger.ms": 0},
            size=args.writers, min_size=args.writers)
        numbers, lock = iter(range(10**9)), threading.Lock()

        def write(count: int) -> None:
            for _ in range(count):
                with lock:
                    number = next(numbers)
                with pool.transaction() as tx:
                    tx.cursor.execute(f"INSERT INTO {table} (id, amount) VALUES (%s, 1)", (number,))
                    tx.produce(topic, value=b"x", key=str(number).encode())

        def run(count: int) -> float:
            threads = [threading.Thread(target=write, args=(count // args.writers,)) for _ in range(args.writers)]
            began = time.monotonic()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            return time.monotonic() - began

        try:
            run(args.warmup)
            with sampled(args.py_spy):
                before = os.times()
                wall = run(args.transactions)
                after = os.times()
        finally:
            pool.close()
        done = args.transactions // args.writers * args.writers
        user, system = (after.user - before.user) / done, (after.system - before.system) / done
        print(f"{args.writers} writers, {done} dual writes on PostgreSQL: {done / wall:.0f} tx/s; CPU per dual write "
              f"{1000 * (user + system):.2f} ms (user {1000 * user:.2f}, system {1000 * system:.2f})"
              f"{' (py-spy sampling)' if args.py_spy else ''}")
        if args.py_spy:
            print(summarize(args.py_spy, args.top))


if __name__ == "__main__":
    main()
