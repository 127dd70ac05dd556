import pytest

from kafka2pc.errors import ConfigError
from kafka2pc.sink.integration import TransactionalIdGrammar, TransactionNamingStrategy
from kafka2pc.sink.naming import ATTEMPT_SLOTS


@pytest.mark.parametrize(("txn_id", "parsed"), [
    ("job-1-0-3", (0, 3)),
    ("job-1-12-0", (12, 0)),
    ("job-10-0-3", None),    # another job whose prefix extends ours
    ("job-1x-0-0", None),
    ("job-1-0-03", None),    # not canonical decimal
    ("job-1-00-3", None),
    ("job-1-0-3-4", None),
    ("job-1-0", None),
    ("job-1--1-3", None),
    ("job-1-a-3", None),
    ("xjob-1-0-3", None),
    ("job-1-0-3 ", None),
    ("job-1-0-\u0663", None),  # a non-ASCII digit
])
def test_grammar_is_exact(txn_id, parsed):
    grammar = TransactionalIdGrammar("job-1")
    assert grammar.parse(txn_id) == parsed
    assert grammar.owns(txn_id) is (parsed is not None)


def test_format_round_trips():
    grammar = TransactionalIdGrammar("orders.v2_sink")
    assert grammar.format(3, 17) == "orders.v2_sink-3-17"
    assert grammar.parse(grammar.format(3, 17)) == (3, 17)
    assert not TransactionalIdGrammar("orders").owns("ordersXv2_sink-3-17")


def test_pattern_treats_dots_literally():
    grammar = TransactionalIdGrammar("a.b")
    assert grammar.owns("a.b-0-0")
    assert not grammar.owns("aXb-0-0")


@pytest.mark.parametrize("prefix", ["", "-job", "job-", "job 1", "job/1", "j" * 201, "jöb"])
def test_bad_prefix_is_a_config_error(prefix):
    with pytest.raises(ConfigError, match=r"transactional\.id\.prefix"):
        TransactionalIdGrammar(prefix)


def test_ids_of_concurrent_attempts_and_consecutive_checkpoints_differ():
    pooling = TransactionNamingStrategy.POOLING
    for checkpoint in range(4):
        ids = {pooling.attempt_counter(checkpoint, attempt) for attempt in range(ATTEMPT_SLOTS)}
        assert len(ids) == ATTEMPT_SLOTS  # attempts of one partition in one checkpoint
        assert not ids & {pooling.attempt_counter(checkpoint + 1, attempt) for attempt in range(ATTEMPT_SLOTS)}
    every = {pooling.attempt_counter(c, a) for c in range(100) for a in range(ATTEMPT_SLOTS)}
    assert every == set(range(2 * ATTEMPT_SLOTS))
    incrementing = TransactionNamingStrategy.INCREMENTING
    every = {incrementing.attempt_counter(c, a) for c in range(100) for a in range(ATTEMPT_SLOTS)}
    assert len(every) == 100 * ATTEMPT_SLOTS
