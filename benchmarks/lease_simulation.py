"""A fleet of simulated DualWriterPools sharing one prefix, leases only (no Kafka, no writers), against a real
PostgreSQL server (the harness starts one, or --postgres DSN): what leasing costs the database at fleet scale, and
how fast live pools take over the ids of dead ones.

Each simulated pool does what a pool's lease keeper does (kafka2pc.dualwrite.keeper), through the real LeaseTable
SQL: it claims ``--ids`` ids at start (a claim that finds nothing, or raises PoolTimeoutError, is retried after
0.2 s), then ticks every ``min(lease_s / 4, 2 s) * uniform(0.8, 1)`` (after the
previous tick ended): every tick scans the fleet's expired leases (``expired()``), every ``lease_s / 3`` renews its
own (``renew()``, then ``holds()`` for any not renewed), and reaps up to 8 expired leases (``claim(expired_only=
True)``, then ``release()``: the settling a real pool does between them, a Kafka recovery on a new connection, is
not simulated). A pool that lost an id claims another (a real one would on its next request).

The pools are multiplexed over ``--workers`` threads, each with one database connection (``--workers`` is capped by
the server's max_connections). Every pool starts at once, as in a fleet's deploy, and ticks from its own start; once
every pool holds its ids (the start-up), ``--duration`` seconds are measured; at ``--kill-at`` seconds ``--kill``
pools die (stop ticking) and the time until another pool claims each of their ids is measured from the death and
from the lease's expiry (the database's clock). PostgreSQL's CPU is read from /proc (the postmaster and its
children, when the server is local).

    python benchmarks/lease_simulation.py [--postgres DSN] [--pools 1000] [--ids 2] [--lease-s 15] [--workers 32]
                                          [--duration 75] [--kill 100] [--kill-at 30] [--explain] [--index]
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import math
import os
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg

import kafka2pc
from kafka2pc.dualwrite.connection import adapt
from kafka2pc.dualwrite.keeper import MAX_TICK_S
from kafka2pc.dualwrite.leases import LeaseTable
from kafka2pc.dualwrite.state_table import StateTable
from kafka2pc.dualwrite.upkeep import REAP_PER_TICK
from kafka2pc.errors import PoolTimeoutError
from kafka2pc_harness.postgres import postgres_dsn

PREFIX = "fleet"
TABLE = "kafka2pc_dual_write_state"
KINDS = ("claim", "renew", "scan", "release", "holds")
_TICK = os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Pool:
    """One simulated pool: the ids it holds (id → its lease token) and its keeper's clock."""

    def __init__(self, index: int):
        self.index = index
        self.holder = f"sim-{index}"
        self.held: dict[str, str] = {}
        self.renewed_at = 0.0
        self.started = False
        self.dead = False


class Stats:
    """What the workers measured; each worker appends to its own lists (merged at the end)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()  # cumulative, for the timeline (under lock)
        self.latency: dict[str, list[float]] = {kind: [] for kind in KINDS}
        self.lateness: list[float] = []
        self.startup_claims: list[float] = []  # the latency of every claim of the start-up
        self.takeovers: list[tuple[str, str, float, float]] = []  # id, taken from, client time, expired_s
        self.false_takeovers: list[tuple[str, str]] = []
        self.lost: list[str] = []
        self.empty_claims = Counter[str]()  # claims that found nothing: reap (normal), grow (insert contention)
        self.errors: list[str] = []


class Simulation:
    def __init__(self, dsn: str, args: argparse.Namespace):
        self.dsn, self.args = dsn, args
        self.lease_s = args.lease_s
        self.tick_s = min(args.lease_s / 4, MAX_TICK_S)  # as LeaseKeeper
        self.pools = [Pool(index) for index in range(args.pools)]
        self.stats = Stats()
        self.stop = threading.Event()
        self.measuring = threading.Event()
        self.started = threading.Semaphore(0)  # released once per pool that holds its ids
        self.failed = threading.Event()
        self.killed_at: float | None = None
        self.victims: set[int] = set()

    # -- one worker thread: a connection, and the pools index % workers == worker --------------------------------

    def lease_table(self, connection: Any) -> LeaseTable:
        return lease_table(connection, self.lease_s)

    def timed(self, kind: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        result = call(*args, **kwargs)
        elapsed = time.perf_counter() - began
        if self.measuring.is_set():
            self.stats.latency[kind].append(elapsed)
            with self.stats.lock:
                self.stats.counts[kind] += 1
        return result

    def claim(self, leases: LeaseTable, pool: Pool) -> bool:
        try:
            lease = self.timed("claim", leases.claim, uuid.uuid4().hex, pool.holder, self.lease_s, max_ids=None)
        except PoolTimeoutError:  # after b294b7f: concurrent claims inserted the next numbers first, every time
            self.stats.empty_claims["grow raised PoolTimeoutError"] += 1
            return False
        if lease is None:  # concurrent claims inserted the next numbers first (a pool retries after 0.2 s)
            self.stats.empty_claims["grow"] += 1
            return False
        pool.held[lease.transactional_id] = lease.token
        if lease.taken_from is not None:
            self.note_takeover(lease.transactional_id, lease.taken_from, lease.expired_s or 0.0)
        return True

    def note_takeover(self, transactional_id: str, taken_from: str, expired_s: float) -> None:
        with self.stats.lock:
            self.stats.takeovers.append((transactional_id, taken_from, time.monotonic(), expired_s))
            victim = taken_from.startswith("sim-") and int(taken_from[4:]) in self.victims
            if not victim:
                self.stats.false_takeovers.append((transactional_id, taken_from))

    def start_up(self, leases: LeaseTable, pool: Pool) -> bool:
        """One claim of a pool's start (a claim that found nothing is retried after 0.2 s). Its keeper ticks from
        its first id on (a pool's keeper starts with its first writer); True once it holds all its ids."""
        began = time.perf_counter()
        claimed = self.claim(leases, pool)
        self.stats.startup_claims.append(time.perf_counter() - began)
        if claimed and pool.renewed_at == 0.0:
            pool.renewed_at = time.monotonic()
        pool.started = len(pool.held) >= self.args.ids
        return claimed

    def tick(self, leases: LeaseTable, pool: Pool) -> None:
        """LeaseKeeper._tick, for a pool whose writers are all idle and finished (nothing to settle or retire)."""
        now = time.monotonic()
        renew_due = now - pool.renewed_at >= self.lease_s / 3
        expired = self.timed("scan", leases.expired)
        if renew_due and pool.held:
            renewed = self.timed("renew", leases.renew, dict(pool.held), self.lease_s)
            pool.renewed_at = now
            for transactional_id in set(pool.held) - renewed:
                if not self.timed("holds", leases.holds, transactional_id, pool.held[transactional_id]):
                    del pool.held[transactional_id]
                    with self.stats.lock:
                        self.stats.lost.append(transactional_id)
        reaped = 0
        while reaped < min(len(expired), REAP_PER_TICK) and not self.stop.is_set():
            lease = self.timed("claim", leases.claim, uuid.uuid4().hex, pool.holder, self.lease_s, max_ids=None,
                               expired_only=True)
            if lease is None:
                self.stats.empty_claims["reap"] += 1
                break
            self.note_takeover(lease.transactional_id, lease.taken_from or "?", lease.expired_s or 0.0)
            self.timed("release", leases.release, lease.transactional_id, lease.token)
            reaped += 1
        while pool.started and len(pool.held) < self.args.ids and not self.stop.is_set() and self.claim(leases, pool):
            pass

    def worker(self, index: int) -> None:
        """Every pool of this worker starts at once (a fleet's deploy) and each ticks from its own start on."""
        mine = self.pools[index::self.args.workers]
        try:
            with psycopg.connect(self.dsn) as connection:
                leases = self.lease_table(connection)
                if hasattr(leases, "limit_idle_transactions"):  # b294b7f: per connection (later: per transaction)
                    leases.limit_idle_transactions(self.lease_s)
                # a due tick goes before a start: a real pool's keeper is a thread of its own, which the start-up
                # storm of claims through these shared connections must not hold up
                ticks: list[tuple[float, int]] = []
                starts = [(time.monotonic(), pool.index) for pool in mine]
                while (ticks or starts) and not self.stop.is_set():
                    now = time.monotonic()
                    if ticks and ticks[0][0] <= now:
                        due, pool_index = heapq.heappop(ticks)
                        pool = self.pools[pool_index]
                        if pool.dead:
                            continue
                        if self.measuring.is_set():
                            self.stats.lateness.append(now - due)
                        try:
                            self.tick(leases, pool)
                        except Exception as exc:  # a keeper logs it and ticks again
                            with self.stats.lock:
                                self.stats.errors.append(repr(exc))
                            with contextlib.suppress(Exception):
                                connection.rollback()
                        heapq.heappush(ticks, (time.monotonic() + self.tick_s * random.uniform(0.8, 1.0), pool_index))
                    elif starts and starts[0][0] <= now:
                        _, pool_index = heapq.heappop(starts)
                        pool = self.pools[pool_index]
                        ticking = bool(pool.held)
                        claimed = self.start_up(leases, pool)
                        if pool.held and not ticking:
                            heapq.heappush(ticks, (time.monotonic() + self.tick_s * random.uniform(0.8, 1.0),
                                                   pool_index))
                        if pool.started:
                            self.started.release()
                        else:
                            heapq.heappush(starts, (time.monotonic() + (0.0 if claimed else 0.2), pool_index))
                    else:
                        due = min(ticks[0][0] if ticks else now + 0.1, starts[0][0] if starts else now + 0.1)
                        self.stop.wait(min(max(0.0, due - now), 0.1))
        except Exception as exc:
            with self.stats.lock:
                self.stats.errors.append(f"worker {index}: {exc!r}")
            self.failed.set()

    # -- the run ----------------------------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        args = self.args
        with psycopg.connect(self.dsn, autocommit=True) as admin:
            limit = int(admin.execute("SHOW max_connections").fetchone()[0])
            reserved = int(admin.execute("SHOW superuser_reserved_connections").fetchone()[0])
            busy = int(admin.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'")
                       .fetchone()[0])
            workers = min(args.workers, limit - reserved - busy - 2)  # room for the sampler and the admin
            if workers < args.workers:
                print(f"max_connections={limit} ({reserved} reserved, {busy} in use): {workers} workers, "
                      f"not {args.workers}")
                args.workers = workers
            with psycopg.connect(self.dsn) as setup:
                self.lease_table(setup).table.ensure_leasing()  # once, before the workers race to create it
                if args.index:
                    setup.execute(f"CREATE INDEX {TABLE}_expiry ON {TABLE} (fleet, lease_expires) "
                                  "WHERE problem IS NULL")
                    setup.commit()
            cpu = PostgresCpu(admin)
            threads = [threading.Thread(target=self.worker, args=(index,), daemon=True)
                       for index in range(args.workers)]
            startup_began = time.monotonic()
            for thread in threads:
                thread.start()
            for _ in self.pools:  # every pool started (the first ones tick meanwhile)
                while not self.started.acquire(timeout=0.5):
                    if self.failed.is_set():
                        self.stop.set()
                        raise SystemExit(f"a worker failed: {self.stats.errors}")
            startup_s = time.monotonic() - startup_began
            startup_grow_empty = self.stats.empty_claims["grow"]
            startup_grow_raised = self.stats.empty_claims["grow raised PoolTimeoutError"]
            ids_at_start = sum(len(pool.held) for pool in self.pools)
            rows_at_start = admin.execute(f"SELECT count(*) FROM {TABLE}").fetchone()[0]

            self.measuring.set()
            load_start = os.getloadavg()[0]
            began, client0, cpu0 = time.monotonic(), os.times(), cpu.seconds()
            sampler = Sampler(self, admin, cpu, began)
            sampler.start()
            self.stop.wait(args.kill_at)
            victims = random.Random(args.seed).sample(self.pools, args.kill)
            self.victims = {pool.index for pool in victims}
            for pool in victims:
                pool.dead = True
            self.killed_at = time.monotonic()
            dead_ids = {tid for pool in victims for tid in list(pool.held)}
            self.stop.wait(max(0.0, began + args.duration - time.monotonic()))
            self.measuring.clear()
            wall, client1, cpu1 = time.monotonic() - began, os.times(), cpu.seconds()
            sampler.stop()
            self.stop.set()
            for thread in threads:
                thread.join(timeout=30)
            table = table_figures(admin)
            plans = explain(admin) if args.explain else {}
        return self.figures(wall=wall, startup_s=startup_s, startup_grow_empty=startup_grow_empty,
                            startup_grow_raised=startup_grow_raised,
                            ids_at_start=ids_at_start, rows_at_start=rows_at_start, dead_ids=dead_ids,
                            pg_cpu_s=None if cpu0 is None or cpu1 is None else cpu1 - cpu0,
                            client_cpu_s=(client1.user + client1.system) - (client0.user + client0.system),
                            table=table, timeline=sampler.rows, load_start=load_start, waits=sampler.waits, plans=plans)

    def figures(self, *, wall: float, dead_ids: set[str], pg_cpu_s: float | None, **extra: Any) -> dict[str, Any]:
        stats, killed_at = self.stats, self.killed_at or 0.0
        counts = {kind: len(stats.latency.get(kind, [])) for kind in KINDS}
        total = sum(counts.values())
        first: dict[str, tuple[float, float]] = {}
        for transactional_id, _, at, expired_s in stats.takeovers:
            if transactional_id in dead_ids and at >= killed_at and transactional_id not in first:
                first[transactional_id] = (at - killed_at, expired_s)
        from_death = [value[0] for value in first.values()]
        from_expiry = [value[1] for value in first.values()]

        def spread(values: list[float]) -> dict[str, float]:
            return {"p50": percentile(values, 0.5), "p99": percentile(values, 0.99),
                    "max": max(values) if values else float("nan")}

        return {
            "bench": "lease-fleet-simulation", "kafka2pc": kafka2pc.__file__, "index": self.args.index,
            "pools": self.args.pools,
            "ids_per_pool": self.args.ids,
            "workers": self.args.workers, "lease_s": self.lease_s, "tick_s": self.tick_s, "measured_s": round(wall, 1),
            "startup_s": round(extra["startup_s"], 2), "startup_claims_that_found_nothing":
                extra["startup_grow_empty"], "startup_claims_that_raised_pool_timeout": extra["startup_grow_raised"],
            "ids_held_at_start": extra["ids_at_start"],
            "startup_claim_ms": {"p50": 1000 * percentile(stats.startup_claims, 0.5),
                                 "p99": 1000 * percentile(stats.startup_claims, 0.99),
                                 "max": 1000 * max(stats.startup_claims, default=float("nan"))},
            "ops": counts, "ops_per_s": {kind: count / wall for kind, count in counts.items()},
            "total_ops_per_s": total / wall,
            "latency_ms": {kind: {"p50": 1000 * percentile(stats.latency.get(kind, []), 0.5),
                                  "p99": 1000 * percentile(stats.latency.get(kind, []), 0.99)} for kind in KINDS},
            "killed_pools": self.args.kill, "dead_ids": len(dead_ids), "dead_ids_taken_over": len(first),
            "takeover_from_death_s": spread(from_death), "takeover_from_expiry_s": spread(from_expiry),
            "false_takeovers": len(stats.false_takeovers), "leases_lost_by_live_pools": len(stats.lost),
            "reap_claims_that_found_nothing": stats.empty_claims["reap"],
            "tick_lateness_ms": {"p50": 1000 * percentile(stats.lateness, 0.5),
                                 "p99": 1000 * percentile(stats.lateness, 0.99),
                                 "max": 1000 * max(stats.lateness, default=float("nan"))},
            "pg_cpu_s": pg_cpu_s, "pg_cores": None if pg_cpu_s is None else pg_cpu_s / wall,
            "pg_cpu_s_per_1000_ops": None if pg_cpu_s is None or not total else 1000 * pg_cpu_s / total,
            "client_cores": extra["client_cpu_s"] / wall, "machine_cores": os.cpu_count(),
            "load_average_1m_at_start_and_end": [extra["load_start"], os.getloadavg()[0]],
            "rows_at_start": extra["rows_at_start"], "table": extra["table"],
            "lock_waits": extra["waits"], "errors": stats.errors[:5], "error_count": len(stats.errors),
            "timeline": extra["timeline"], "plans": extra["plans"],
        }


def lease_table(connection: Any, lease_s: float) -> LeaseTable:
    """The real LeaseTable on ``connection`` (its constructor took ``lease_s`` after b294b7f)."""
    table = StateTable(adapt(connection), TABLE)
    try:
        return LeaseTable(table, PREFIX, lease_s=lease_s)  # type: ignore[call-arg]
    except TypeError:
        return LeaseTable(table, PREFIX)


# -- PostgreSQL's side -------------------------------------------------------------------------------------------


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()  # after "pid (comm) ": state, ppid, ...


class PostgresCpu:
    """CPU seconds of the server: the postmaster's own and its reaped children's (cutime, cstime: backends and
    workers that exited), plus every live child's; None when the server is not on this machine."""

    def __init__(self, admin: psycopg.Connection[Any]):
        backend = int(admin.execute("SELECT pg_backend_pid()").fetchone()[0])
        fields = _stat(backend)
        self.postmaster = int(fields[1]) if fields else None
        if self.postmaster is not None:
            with contextlib.suppress(OSError):
                if Path(f"/proc/{self.postmaster}/comm").read_text().strip() != "postgres":
                    self.postmaster = None

    def seconds(self) -> float | None:
        if self.postmaster is None:
            return None
        own = _stat(self.postmaster)
        if own is None:
            return None
        ticks = sum(int(value) for value in own[11:15])  # utime stime cutime cstime
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                fields = _stat(int(entry.name))
                if fields and fields[1] == str(self.postmaster):
                    ticks += int(fields[11]) + int(fields[12])
        return ticks / _TICK


class Sampler:
    """Every 0.25 s the backends waiting on a lock; every 5 s a timeline row (ops/s by kind, PostgreSQL's cores)."""

    def __init__(self, sim: Simulation, admin: psycopg.Connection[Any], cpu: PostgresCpu, began: float):
        self.sim, self.admin, self.cpu, self.began = sim, admin, cpu, began
        self.rows: list[dict[str, Any]] = []
        self.waits: dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        samples, waiting, events = 0, 0, Counter[str]()
        last_at, last_counts, last_cpu = self.began, Counter[str](), self.cpu.seconds()
        while not self._stop.wait(0.25):
            rows = self.admin.execute("SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE backend_type = "
                                      "'client backend' AND state = 'active' AND pid <> pg_backend_pid()").fetchall()
            samples += 1
            for kind, event in rows:
                if kind == "Lock":
                    waiting += 1
                if kind:
                    events[f"{kind}:{event}"] += 1
            now = time.monotonic()
            if now - last_at >= 5.0:
                with self.sim.stats.lock:
                    counts = Counter(self.sim.stats.counts)
                cpu = self.cpu.seconds()
                span = now - last_at
                rates = {kind: round((counts[kind] - last_counts[kind]) / span) for kind in KINDS}
                self.rows.append({"t": round(now - self.began), **rates,
                                  "pg_cores": None if cpu is None or last_cpu is None else (cpu - last_cpu) / span})
                last_at, last_counts, last_cpu = now, counts, cpu
        self.waits = {"samples": samples, "mean_backends_waiting_on_a_lock": waiting / max(1, samples),
                      "top_wait_events": dict(events.most_common(6))}


def table_figures(admin: psycopg.Connection[Any]) -> dict[str, Any]:
    now = "EXTRACT(EPOCH FROM clock_timestamp())"
    rows, leased, free, expired = admin.execute(
        f"SELECT count(*), count(*) FILTER (WHERE lease_expires >= {now}), count(*) FILTER (WHERE lease_expires IS "
        f"NULL), count(*) FILTER (WHERE lease_expires < {now}) FROM {TABLE}").fetchone()
    size, dead, updates, hot, vacuums, vacuumed_s_ago = admin.execute(
        f"SELECT pg_total_relation_size('{TABLE}'), n_dead_tup, n_tup_upd, n_tup_hot_upd, autovacuum_count, "
        f"EXTRACT(EPOCH FROM clock_timestamp() - last_autovacuum) FROM pg_stat_user_tables WHERE relname = '{TABLE}'"
    ).fetchone()
    return {"rows": rows, "leased": leased, "free": free, "expired": expired, "bytes": size, "dead_tuples": dead,
            "updates": updates, "hot_updates": hot, "autovacuums": vacuums,
            "last_autovacuum_s_ago": None if vacuumed_s_ago is None else round(float(vacuumed_s_ago), 1)}


def explain(admin: psycopg.Connection[Any]) -> dict[str, str]:
    """The plans of the scan and the claim's select, on the table as the run left it."""
    with psycopg.connect(admin.info.dsn) as connection:
        leases = lease_table(connection, 15.0)
        table = leases.table
        now = table.now
        scan = leases._in_fleet(f" AND problem IS NULL AND lease_expires < {now}").join(
            (f"SELECT transactional_id, {now} - lease_expires FROM {TABLE} WHERE ", " ORDER BY lease_expires"))
        claim = leases._in_fleet(f" AND problem IS NULL AND (lease_expires IS NULL OR lease_expires < {now})").join(
            (f"SELECT transactional_id, fleet_index, holder, {now} - lease_expires FROM {TABLE} WHERE ",
             " ORDER BY fleet_index LIMIT 1 FOR UPDATE SKIP LOCKED"))
        plans = {}
        for name, sql in (("scan", scan), ("claim", claim)):
            result = connection.execute(f"EXPLAIN (ANALYZE, BUFFERS) {table.sql(sql)}",
                                        (f"{PREFIX}-", f"{PREFIX}.", PREFIX)).fetchall()
            plans[name] = "\n".join(row[0] for row in result)
            connection.rollback()
    return plans


# -- output ------------------------------------------------------------------------------------------------------


def report(figures: dict[str, Any]) -> None:
    f = figures
    print(f"\n{f['pools']} simulated pools x {f['ids_per_pool']} ids, lease_s={f['lease_s']:g}, tick "
          f"{f['tick_s']:g} s x U(0.8, 1), on {f['workers']} connections; start-up {f['startup_s']:.1f} s "
          f"({f['ids_held_at_start']} ids; claims retried after 0.2 s: {f['startup_claims_that_found_nothing']} that "
          f"found nothing, {f['startup_claims_that_raised_pool_timeout']} that raised PoolTimeoutError); "
          f"{f['measured_s']:.0f} s measured; kafka2pc from {f['kafka2pc']}")
    startup = f["startup_claim_ms"]
    print(f"  start-up claims: p50 {startup['p50']:.1f} ms, p99 {startup['p99']:.1f} ms, max {startup['max']:.1f} ms")
    print(f"  {'operation':10s} {'ops':>8s} {'ops/s':>8s} {'p50 ms':>8s} {'p99 ms':>8s}")
    for kind in KINDS:
        latency = f["latency_ms"][kind]
        print(f"  {kind:10s} {f['ops'][kind]:8d} {f['ops_per_s'][kind]:8.1f} {latency['p50']:8.2f} "
              f"{latency['p99']:8.2f}")
    print(f"  {'total':10s} {sum(f['ops'].values()):8d} {f['total_ops_per_s']:8.1f}")
    death, expiry = f["takeover_from_death_s"], f["takeover_from_expiry_s"]
    print(f"\n  takeover of {f['dead_ids_taken_over']}/{f['dead_ids']} ids of {f['killed_pools']} dead pools "
          f"(s)        p50      p99      max")
    print(f"    from the death                             {death['p50']:8.2f} {death['p99']:8.2f} {death['max']:8.2f}")
    print(f"    from the lease's expiry                    {expiry['p50']:8.3f} {expiry['p99']:8.3f} "
          f"{expiry['max']:8.3f}")
    print(f"  false takeovers (a live pool's id): {f['false_takeovers']}; leases lost by live pools: "
          f"{f['leases_lost_by_live_pools']}; reap claims that found nothing: {f['reap_claims_that_found_nothing']}")
    late = f["tick_lateness_ms"]
    print(f"  tick lateness (the simulation keeping up) p50 {late['p50']:.1f} ms, p99 {late['p99']:.1f} ms, max "
          f"{late['max']:.1f} ms; errors: {f['error_count']} {f['errors'][:2]}")
    load = f["load_average_1m_at_start_and_end"]
    if f["pg_cores"] is not None:
        print(f"  PostgreSQL CPU: {f['pg_cpu_s']:.1f} s in {f['measured_s']:.0f} s = {f['pg_cores']:.2f} cores; "
              f"{f['pg_cpu_s_per_1000_ops']:.2f} CPU s per 1000 lease ops; this client {f['client_cores']:.2f} "
              f"cores (machine: {f['machine_cores']} cores, 1-min load average {load[0]:.1f} at the start, "
              f"{load[1]:.1f} at the end)")
    else:
        print(f"  PostgreSQL CPU: n/a (server not on this machine); client {f['client_cores']:.2f} cores")
    table = f["table"]
    print(f"  state table: {table['rows']} rows ({table['leased']} leased, {table['free']} free, {table['expired']} "
          f"expired), {table['bytes'] / 1024:.0f} KiB, {table['dead_tuples']} dead tuples, "
          f"{table['hot_updates']}/{table['updates']} updates HOT; {table['autovacuums']} autovacuums, the last "
          f"{table['last_autovacuum_s_ago']} s before the end")
    waits = f["lock_waits"]
    print(f"  backends waiting on a lock (mean over {waits.get('samples', 0)} samples): "
          f"{waits.get('mean_backends_waiting_on_a_lock', 0):.2f}; wait events: {waits.get('top_wait_events')}")
    print(f"\n  {'t s':>4s} " + " ".join(f"{kind + '/s':>9s}" for kind in KINDS) + f" {'pg cores':>9s}")
    for row in f["timeline"]:
        cores = "n/a" if row["pg_cores"] is None else f"{row['pg_cores']:.2f}"
        print(f"  {row['t']:4d} " + " ".join(f"{row[kind]:9d}" for kind in KINDS) + f" {cores:>9s}")
    for name, plan in f["plans"].items():
        print(f"\n  plan of the {name}:\n    " + plan.replace("\n", "\n    "))
    print("\n" + json.dumps(_finite({key: value for key, value in f.items() if key not in ("timeline", "plans")})))


def _finite(value: Any) -> Any:
    """NaN (no operation of a kind) as null: strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    return value


@contextlib.contextmanager
def scoped_postgres(dsn: str | None) -> Iterator[str]:
    """A schema of its own on the server (``--postgres``, or one the harness starts), so the table is fresh."""
    with contextlib.ExitStack() as stack:
        base = dsn or stack.enter_context(postgres_dsn())
        schema = f"fleet_sim_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(f"CREATE SCHEMA {schema}")
        try:
            yield psycopg.conninfo.make_conninfo(base, options=f"-c search_path={schema}")
        finally:
            with psycopg.connect(base, autocommit=True) as admin:
                admin.execute(f"DROP SCHEMA {schema} CASCADE")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--postgres", metavar="DSN")
    parser.add_argument("--pools", type=int, default=1000)
    parser.add_argument("--ids", type=int, default=2, help="ids each pool claims at start")
    parser.add_argument("--lease-s", type=float, default=15.0)
    parser.add_argument("--workers", type=int, default=32, help="threads, one connection each")
    parser.add_argument("--duration", type=float, default=75.0, help="seconds measured after the start-up")
    parser.add_argument("--kill", type=int, default=100, help="pools that die midway")
    parser.add_argument("--kill-at", type=float, default=30.0, help="seconds into the measured run")
    parser.add_argument("--seed", type=int, default=29)
    parser.add_argument("--explain", action="store_true", help="print the plans of the scan and the claim")
    parser.add_argument("--index", action="store_true",
                        help="an experiment: index (fleet, lease_expires) WHERE problem IS NULL first")
    args = parser.parse_args()
    with scoped_postgres(args.postgres) as dsn:
        report(Simulation(dsn, args).run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
