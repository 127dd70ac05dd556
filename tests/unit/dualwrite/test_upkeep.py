"""What a pool's lease keeper does on a tick (kafka2pc.dualwrite.upkeep.plan_upkeep), for every combination of a
few writers' states."""

from __future__ import annotations

import itertools

import pytest

from kafka2pc.dualwrite.upkeep import REAP_PER_TICK, Upkeep, WriterView, plan_upkeep

STATES = [(None, False), (None, True), (1.0, False), (1.0, True), (120.0, False), (120.0, True)]


@pytest.mark.parametrize("min_size", [0, 1, 2, 3])
def test_every_combination_of_three_writers(min_size):
    for states in itertools.product(STATES, repeat=3):
        writers = [WriterView(f"w-{n}", idle, unfinished) for n, (idle, unfinished) in enumerate(states)]
        plan = plan_upkeep(writers, expired=3, min_size=min_size, idle_s=60)
        ids = [w.transactional_id for w in writers]
        assert set(plan.settle) == {w.transactional_id for w in writers if w.idle_s is not None and w.unfinished}
        for name in plan.retire:  # only idle long enough and finished: a retired writer gives its id back
            writer = writers[ids.index(name)]
            assert writer.idle_s is not None and writer.idle_s >= 60 and not writer.unfinished
        assert len(writers) - len(plan.retire) >= min(min_size, len(writers))
        candidates = [w for w in writers if w.idle_s is not None and w.idle_s >= 60 and not w.unfinished]
        assert len(plan.retire) == min(len(candidates), max(0, len(writers) - min_size))
        assert not set(plan.retire) & set(plan.settle)
        assert plan.reap == 3


def test_the_longest_idle_writers_are_retired_first_and_reaping_is_bounded_per_tick():
    writers = [WriterView("a", 70.0, False), WriterView("b", 300.0, False), WriterView("c", 90.0, False)]
    plan = plan_upkeep(writers, expired=100, min_size=1, idle_s=60)
    assert plan == Upkeep(retire=("b", "c"), reap=REAP_PER_TICK)
    assert plan_upkeep([], expired=0, min_size=0, idle_s=60) == Upkeep()
