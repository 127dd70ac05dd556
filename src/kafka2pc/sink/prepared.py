"""A prepared transaction as the writer hands it to the committer."""

from __future__ import annotations

from typing import Any

import attrs

from kafka2pc.prepared_state import PreparedTxnState


@attrs.frozen
class PreparedTransaction:
    """Transaction ``state`` of ``transactional_id``, prepared by ``subtask`` for ``checkpoint``."""

    transactional_id: str = attrs.field(validator=attrs.validators.instance_of(str))
    state: PreparedTxnState = attrs.field(validator=attrs.validators.instance_of(PreparedTxnState))
    subtask: int = attrs.field(validator=attrs.validators.instance_of(int))
    checkpoint: int = attrs.field(validator=attrs.validators.instance_of(int))

    def __attrs_post_init__(self) -> None:
        if self.state.is_empty:
            raise ValueError(f"{self.transactional_id!r}: an empty transaction is never handed over")

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the transaction protocol is recorded, so completion never has to infer it)."""
        return {"transactional_id": self.transactional_id, "state": str(self.state), "subtask": self.subtask,
                "checkpoint": self.checkpoint, "transaction_version": self.state.transaction_version}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PreparedTransaction:
        """The inverse of :meth:`to_json`; raises KeyError/ValueError/TypeError on a malformed dict."""
        state = PreparedTxnState.parse(data["state"], transaction_version=data.get("transaction_version"))
        return cls(data["transactional_id"], state, data["subtask"], data["checkpoint"])
