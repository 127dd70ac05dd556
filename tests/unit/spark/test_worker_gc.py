"""The freeze of a reused Spark worker's objects (kafka2pc.spark.worker_gc): once per process, only where pyspark
collects after every task, never with the collector off or the switch at 0."""

from __future__ import annotations

import pytest

from kafka2pc.spark import worker_gc


class FakeGc:
    def __init__(self, enabled: bool = True):
        self.enabled, self.freezes = enabled, 0

    def isenabled(self) -> bool:
        return self.enabled

    def freeze(self) -> None:
        self.freezes += 1

    def get_freeze_count(self) -> int:
        return 1000 * self.freezes


@pytest.fixture
def fake_gc(monkeypatch):
    gc = FakeGc()
    monkeypatch.setattr(worker_gc, "gc", gc)
    monkeypatch.setattr(worker_gc, "_frozen", False)
    monkeypatch.setenv(worker_gc.REUSE_VARIABLE, "1")
    monkeypatch.delenv(worker_gc.SWITCH_VARIABLE, raising=False)
    return gc


def test_a_reused_worker_freezes_once(fake_gc):
    assert worker_gc.freeze_once() is True
    assert worker_gc.freeze_once() is False
    assert fake_gc.freezes == 1


def test_a_worker_that_runs_one_task_does_not_freeze(fake_gc, monkeypatch):
    monkeypatch.delenv(worker_gc.REUSE_VARIABLE)
    assert worker_gc.freeze_once() is False and fake_gc.freezes == 0


@pytest.mark.parametrize("off", ["0", "false", "OFF", " no "])
def test_the_switch_turns_it_off(fake_gc, monkeypatch, off):
    monkeypatch.setenv(worker_gc.SWITCH_VARIABLE, off)
    assert worker_gc.freeze_once() is False and fake_gc.freezes == 0


def test_any_other_value_of_the_switch_leaves_it_on(fake_gc, monkeypatch):
    monkeypatch.setenv(worker_gc.SWITCH_VARIABLE, "1")
    assert worker_gc.freeze_once() is True and fake_gc.freezes == 1


def test_a_process_with_its_collector_off_is_left_alone(fake_gc):
    fake_gc.enabled = False
    assert worker_gc.freeze_once() is False and fake_gc.freezes == 0
