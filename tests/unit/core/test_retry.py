"""Retry: the one retry policy, an immutable value."""

import pytest

from kafka2pc._core.retry import Retry


def series(policy: Retry, now: float | None = None, step: float = 0.0) -> list[float]:
    delays, retry = [], policy.started(now)
    while True:
        now = None if now is None else now + step
        following = retry.next(now)
        if following is None:
            return delays
        delays.append(following.delay_s)
        retry = following


def test_backoff_grows_to_its_cap_with_jitter_below_the_nominal_delay():
    delays = series(Retry(total=8, backoff_s=0.1, factor=2.0, max_backoff_s=1.0, jitter=0.25))
    nominal = [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0, 1.0]
    assert len(delays) == 8
    assert all(0.75 * n <= d <= n for d, n in zip(delays, nominal, strict=True))


def test_jitter_spreads_clients_that_retry_together():
    assert len({series(Retry(total=3, jitter=0.5))[2] for _ in range(20)}) > 1


def test_no_jitter_is_exact():
    assert series(Retry(total=3, backoff_s=0.05, jitter=0.0)) == [0.05, 0.1, 0.2]


def test_the_count_limit():
    assert series(Retry(total=0)) == []
    assert len(series(Retry(total=5))) == 5


def test_the_time_limit_counts_from_the_start_and_no_try_starts_past_it():
    policy = Retry(timeout_s=10.0, backoff_s=1.0, factor=1.0, jitter=0.0)
    assert len(series(policy, now=100.0, step=2.0)) == 4  # tries at 102+1, 104+1, 106+1, 108+1; 110+1 > 110
    assert series(policy, now=100.0, step=20.0) == []


def test_without_a_clock_only_the_count_limits():
    assert len(series(Retry(total=3, timeout_s=0.001))) == 3


def test_the_policy_value_is_immutable_and_each_series_starts_afresh():
    policy = Retry(total=2)
    first = policy.started().next()
    assert first is not None and first.tries == 1 and policy.tries == 0
    assert policy.started().tries == 0


def test_negative_settings_are_refused():
    with pytest.raises(ValueError, match="backoff_s"):
        Retry(backoff_s=-1)


def test_describe_says_the_limit():
    assert Retry(timeout_s=60).describe() == "within 60 s"
    assert Retry(total=3).started().describe() == "after 1 tries"
