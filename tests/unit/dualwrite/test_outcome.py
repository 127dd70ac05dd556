"""What a dual writer concludes after its database commit reported an error (issue 28, 2): only the session that
sent the commit, or the row's token, proves an outcome."""

from __future__ import annotations

import pytest

from kafka2pc.dualwrite.outcome import CommitOutcome, ReadBack, judge_failed_commit


@pytest.mark.parametrize(("token_seen", "same_session", "definite_error", "outcome"), [
    (True, True, False, CommitOutcome.COMMITTED),
    (True, False, False, CommitOutcome.COMMITTED),  # visible anywhere: it landed
    (False, True, False, CommitOutcome.FAILED),  # the session that sent it is alive and its transaction is gone
    (False, False, False, CommitOutcome.UNKNOWN),  # a new session: the commit may still be landing
    (None, False, False, CommitOutcome.UNKNOWN),  # unreadable
    (None, False, True, CommitOutcome.FAILED),  # the database answered "constraint violated" at commit
    (False, False, True, CommitOutcome.FAILED),
])
def test_only_the_sending_session_or_a_definite_error_proves_a_failure(token_seen, same_session, definite_error,
                                                                       outcome):
    assert judge_failed_commit(ReadBack(token_seen, same_session), definite_error=definite_error) is outcome
