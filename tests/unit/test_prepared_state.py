import pytest

from kafka2pc import PreparedTxnState
from kafka2pc.errors import InvalidPreparedStateError


@pytest.mark.parametrize("text", ["0:0", "123:45", "9223372036854775807:32767"])
def test_round_trip(text):
    state = PreparedTxnState.parse(text)
    assert str(state) == text
    assert not state.is_empty


def test_empty_string_is_no_transaction():
    state = PreparedTxnState.parse("")
    assert state.is_empty
    assert str(state) == ""
    assert state == PreparedTxnState.empty()


@pytest.mark.parametrize("text", ["123", "123:", ":45", "a:1", "1:b", "1:2:3", " 1:2", "1:2 ", "-1:0", "1:-1",
                                  "1:32768", "\u0661:\u0662", "1.0:2"])
def test_bad_strings_are_rejected(text):
    with pytest.raises(InvalidPreparedStateError):
        PreparedTxnState.parse(text)


def test_non_string_is_rejected():
    with pytest.raises(InvalidPreparedStateError):
        PreparedTxnState.parse(123)  # type: ignore[arg-type]


def test_constructor_validates():
    with pytest.raises(InvalidPreparedStateError):
        PreparedTxnState(-5, 0)
    with pytest.raises(InvalidPreparedStateError):
        PreparedTxnState(True, 0)  # type: ignore[arg-type]


def test_is_a_value():
    assert PreparedTxnState(1, 2) == PreparedTxnState.parse("1:2")
    assert len({PreparedTxnState(1, 2), PreparedTxnState.parse("1:2")}) == 1
