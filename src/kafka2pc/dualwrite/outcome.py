"""What a dual writer concludes after its database commit reported an error (sans-IO: the writer acts on it).

The writer reads the state row back. Its token there proves the commit landed, on any session. Its absence proves
that the commit failed only on the session that sent it: on another one (SQLAlchemy reconnects after a disconnect;
a pooler may drop only the client's side) the commit may still be landing, a synchronous standby not yet
acknowledged. Then the outcome is unknown: Kafka stays prepared and recovery, which reads the row under its lock
(after the old transaction ends), decides."""

from __future__ import annotations

import enum

import attrs


class CommitOutcome(enum.Enum):
    """What a failed database commit is taken to have done."""

    COMMITTED = "committed"
    FAILED = "failed"
    UNKNOWN = "unknown"


@attrs.frozen
class ReadBack:
    """The row read back after a failed commit: ``token_seen`` (None: it could not be read) and whether the read
    ran on the session that sent the commit."""

    token_seen: bool | None
    same_session: bool


def judge_failed_commit(read_back: ReadBack, *, definite_error: bool) -> CommitOutcome:
    """``definite_error``: the database answered the commit with an error that means it did not commit (a
    constraint, a SQL error), on a connection that is still there."""
    if read_back.token_seen:
        return CommitOutcome.COMMITTED
    if definite_error or (read_back.token_seen is False and read_back.same_session):
        return CommitOutcome.FAILED
    return CommitOutcome.UNKNOWN
