import pytest

from kafka2pc.errors import ConfigError, IdPoolExhaustedError
from kafka2pc.sink.integration import TransactionalIdPool, TransactionNamingStrategy


def test_pooling_reuses_released_ids_lowest_first():
    pool = TransactionalIdPool("job", 2)
    pool, first = pool.acquire()
    pool, second = pool.acquire()
    assert (first, second) == ("job-2-0", "job-2-1")
    pool = pool.release(second).release(first)
    pool, again = pool.acquire()
    assert again == "job-2-0"
    assert pool.in_use == (0,) and pool.free == (1,)


def test_steady_state_uses_three_ids():
    pool, used = TransactionalIdPool("job", 0), set()
    pending = None
    for _ in range(100):  # one open transaction, the previous one waiting for its commit
        pool, current = pool.acquire()
        used.add(current)
        if pending:
            pool = pool.release(pending)
        pending = current
    assert len(used) <= 3


def test_incrementing_never_reuses():
    pool = TransactionalIdPool("job", 0, TransactionNamingStrategy.INCREMENTING)
    seen = []
    for _ in range(5):
        pool, txn_id = pool.acquire()
        seen.append(txn_id)
        pool = pool.release(txn_id)
    assert seen == [f"job-0-{i}" for i in range(5)]
    assert pool.free == ()


def test_cap_on_live_ids():
    pool = TransactionalIdPool("job", 0, max_live=2)
    pool, _ = pool.acquire()
    pool, _ = pool.acquire()
    with pytest.raises(IdPoolExhaustedError, match="max 2"):
        pool.acquire()


def test_json_round_trip_and_validation():
    pool = TransactionalIdPool("job", 1, max_live=4).acquire()[0].acquire()[0]
    pool = pool.release("job-1-0")
    assert TransactionalIdPool.from_json(pool.to_json()) == pool
    with pytest.raises(ConfigError):
        TransactionalIdPool("job", -1)
    with pytest.raises(ValueError, match="not an id of subtask 1"):
        pool.release("job-2-0")
    with pytest.raises(ValueError, match="both in use and free"):
        TransactionalIdPool("job", 0, in_use=(1,), free=(1,))


def test_adopt_ids_found_on_broker_and_release_all():
    pool = TransactionalIdPool("job", 0).adopt(["job-0-4", "job-0-1", "job-1-0", "job-00-0", "other-0-9"])
    assert pool.free == (1, 4) and pool.next_counter == 5
    pool, txn_id = pool.acquire()
    assert txn_id == "job-0-1"
    assert pool.release_all().in_use == ()
    assert pool.known_ids == ["job-0-1", "job-0-4"]
