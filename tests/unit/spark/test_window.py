"""What a task attempt concludes from the write window it reads (kafka2pc.spark.window.check_window)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kafka2pc._core.messages import ObservedTransaction
from kafka2pc.errors import BatchOverError
from kafka2pc.spark.window import check_window, window_id


def control(observed: ObservedTransaction | None):
    asked: list[str] = []

    def describe(transactional_id: str) -> ObservedTransaction | None:
        asked.append(transactional_id)
        return observed

    return SimpleNamespace(describe=describe, asked=asked)


def test_an_unmoved_window_lets_the_attempt_write():
    seen = control(ObservedTransaction("Empty", 4, 7))
    check_window(seen, "job", "4:7", "attempt 0")
    assert seen.asked == [window_id("job")] == ["job-window"]


@pytest.mark.parametrize("now", [ObservedTransaction("Empty", 4, 8), ObservedTransaction("Empty", 5, 0)])
def test_a_moved_window_stops_the_attempt(now):
    with pytest.raises(BatchOverError, match="attempt 0: the batch it writes for is over"):
        check_window(control(now), "job", "4:7", "attempt 0")


def test_an_expired_window_counts_as_not_moved_and_an_unplanned_one_is_not_read():
    check_window(control(None), "job", "4:7", "attempt 0")
    unread = control(ObservedTransaction("Empty", 4, 8))
    check_window(unread, "job", "", "attempt 0")
    assert unread.asked == []
