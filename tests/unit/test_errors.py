"""Every exception class kafka2pc raises: grouped by what the caller should do, and picklable with its attributes
(Spark ships a task's exception to the driver, multiprocessing between processes)."""

import inspect
import pathlib
import pickle
import re

import pytest

from kafka2pc import errors
from kafka2pc.sink.integration import RecoveryReport
from kafka2pc.testing import errors as harness_errors

GROUPS = (errors.RetriableError, errors.TransactionAbortableError, errors.FatalError, errors.OutcomeUnknownError,
          errors.DecidedNotCompletedError, errors.UsageError)


def every_class():
    found = {cls for module in (errors, harness_errors) for _, cls in inspect.getmembers(module, inspect.isclass)
             if issubclass(cls, errors.Kafka2pcError)}
    return sorted(found, key=lambda cls: cls.__name__)


#: constructor arguments of the classes whose __init__ takes more than a message
ARGUMENTS = {
    errors.ConfigError: ("bootstrap.servers", "is required"),
    errors.KafkaProtocolError: ("EndTxn", "INVALID_TXN_STATE", 48, "transaction 5:3"),
    errors.TransactionStateError: ("produce", "PREPARED", "only complete may follow"),
    errors.TransactionLostError: ("orders-0", 5, 3, "the broker aborted it"),
    errors.TransactionOutcomeUnknownError: ("orders-0", "5:3", "the id moved on"),
    errors.TransactionNotSettledError: ("orders-0", "5:3", "EndTxn answered UNKNOWN_SERVER_ERROR"),
    errors.RecoveryIncompleteError: (RecoveryReport((1,), ("p-0-0",), (), (), 0.5, (2,)),
                                     {2: errors.TransactionLostError("p-0-1", 5, 3, "aborted")}),
}


def test_every_class_is_in_exactly_one_group():
    for cls in every_class():
        if cls in (errors.Kafka2pcError, *GROUPS):
            continue
        assert [group for group in GROUPS if issubclass(cls, group)] != [], cls
        assert len([group for group in GROUPS if issubclass(cls, group)]) == 1, cls


@pytest.mark.parametrize("cls", every_class(), ids=lambda cls: cls.__name__)
def test_every_class_round_trips_through_pickle_with_its_attributes(cls):
    error = cls(*ARGUMENTS.get(cls, ("something went wrong",)))
    error.extra = "set after construction"
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls
    assert str(copy) == str(error) and copy.args == error.args
    assert vars(copy).keys() == vars(error).keys()
    for name, value in vars(error).items():
        if isinstance(value, dict):  # RecoveryIncompleteError.stuck: exceptions compare by identity
            assert {k: (type(v), str(v)) for k, v in getattr(copy, name).items()} == \
                {k: (type(v), str(v)) for k, v in value.items()}
        else:
            assert getattr(copy, name) == value, name


def test_the_outcome_unknown_error_keeps_what_is_known():
    error = errors.TransactionOutcomeUnknownError("orders-0", "5:3", "the id moved on", observed="Empty at 5:9",
                                                  other_pending="5:10", still_pending=True)
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.observed, copy.other_pending, copy.still_pending) == ("Empty at 5:9", "5:10", True)


@pytest.mark.parametrize(("error", "retriable", "fatal", "abort"), [
    (errors.BrokerUnavailableError("down"), True, False, False),
    (errors.TransactionNotSettledError("t", "5:3", "no answer"), True, False, False),  # call the same end again
    (errors.TransactionAbortableError("write failed"), False, False, True),
    (errors.ProducerFencedError("fenced"), False, True, False),
    (errors.TransactionOutcomeUnknownError("t", "5:3", "moved on"), False, False, False),
    (errors.ConfigError("acks", "must be all"), False, False, False),
])
def test_confluent_kafkas_three_questions(error, retriable, fatal, abort):
    assert (error.retriable(), error.fatal(), error.txn_requires_abort()) == (retriable, fatal, abort)


def test_todays_names_are_still_caught_where_users_catch_them():
    """Names users may catch kept their classes (only their base moved into a group)."""
    from kafka2pc.dualwrite import DualWriteIncompleteError  # noqa: PLC0415
    from kafka2pc.sink import DecisionConflictError, IdPoolExhaustedError  # noqa: PLC0415
    from kafka2pc.spark import WriteConflictError, WriteDecidedError  # noqa: PLC0415

    assert issubclass(errors.ConfigError, ValueError) and issubclass(errors.RecordTooLargeError, ValueError)
    assert issubclass(errors.IncompleteListingError, errors.BrokerUnavailableError)
    for cls in (DualWriteIncompleteError, DecisionConflictError, IdPoolExhaustedError, WriteConflictError,
                WriteDecidedError):
        assert cls.__module__ == "kafka2pc.errors"


def test_the_not_settled_error_keeps_its_code_through_pickle():
    error = errors.TransactionNotSettledError("orders-0", "5:3", "EndTxn answered UNKNOWN_SERVER_ERROR", error_code=-1)
    error.__cause__ = errors.KafkaProtocolError("EndTxn", "UNKNOWN_SERVER_ERROR", -1)
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.transactional_id, copy.requested, copy.error_code) == ("orders-0", "5:3", -1)
    assert "whether it ended is not known yet: retry" in str(copy)
    assert isinstance(copy, errors.BrokerUnavailableError)  # caught where a timed-out end always was


def design_error_table() -> dict[str, tuple[str, str]]:
    """docs/design.md's table of errors: class -> (its group, what the caller does)."""
    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "design.md").read_text()
    section = text[text.index("## One classification of errors"):]
    section = section[:section.index("\n## ", 1)]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and re.fullmatch(r"`\w+`", cells[0]):
            rows[cells[0].strip("`")] = (cells[1].strip("`"), cells[2])
    return rows


def test_design_md_lists_every_error_class_under_its_group_with_what_to_do():
    rows = design_error_table()
    public = {cls.__name__: cls for _, cls in inspect.getmembers(errors, inspect.isclass)
              if issubclass(cls, errors.Kafka2pcError) and cls.__module__ == errors.__name__}
    assert set(rows) == set(public) - {"Kafka2pcError"}, (set(public) - set(rows), set(rows) - set(public))
    for name, (group, does) in rows.items():
        assert getattr(errors, group) in GROUPS, (name, group)
        assert issubclass(public[name], getattr(errors, group)), (name, group)
        assert len(does) > 10, name
