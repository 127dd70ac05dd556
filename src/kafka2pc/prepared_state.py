"""The handle of a prepared transaction, as KIP-939 serializes it: ``"<producerId>:<epoch>"``."""

from __future__ import annotations

import attrs

from kafka2pc.errors import InvalidPreparedStateError

_NO_ID = -1
MAX_EPOCH = 32767  # producer epochs are int16
TRANSACTION_VERSIONS = (1, 2)


def _check_ids(instance: PreparedTxnState, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidPreparedStateError(f"{attribute.name} must be an int, got {value!r}")


def _check_version(instance: PreparedTxnState, attribute: attrs.Attribute[int | None], value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or value not in TRANSACTION_VERSIONS):
        raise InvalidPreparedStateError(f"transaction_version must be 1, 2 or None, got {value!r}")


@attrs.frozen(order=False)
class PreparedTxnState:
    """Identifies one prepared transaction by producer id and epoch; store ``str(state)`` durably and pass
    :meth:`parse` of it to ``complete_transaction`` after a restart.

    ``PreparedTxnState.parse("")`` (or :meth:`empty`) means "no transaction".

    ``transaction_version`` is the transaction protocol (KIP-890) the transaction was written with, which decides
    how the coordinator reports its end. The producer sets it; it is not part of KIP-939's string form, so a state
    parsed from that string has None and completion uses the cluster's current protocol. Store it beside the string
    (the sink's decision log does) when the cluster's ``transaction.version`` may change in between. It takes no part
    in equality: two handles of the same producer id and epoch name the same transaction.
    """

    producer_id: int = attrs.field(validator=_check_ids)
    epoch: int = attrs.field(validator=_check_ids)
    transaction_version: int | None = attrs.field(default=None, eq=False, validator=_check_version)

    def __attrs_post_init__(self) -> None:
        empty = self.producer_id == _NO_ID and self.epoch == _NO_ID
        if not empty and not (self.producer_id >= 0 and 0 <= self.epoch <= MAX_EPOCH):
            raise InvalidPreparedStateError(
                f"producer id must be >= 0 and epoch within 0..{MAX_EPOCH}, got {self.producer_id}:{self.epoch}")

    @classmethod
    def empty(cls) -> PreparedTxnState:
        """The state that stands for "no transaction"."""
        return cls(_NO_ID, _NO_ID)

    @property
    def is_empty(self) -> bool:
        """Whether this is the "no transaction" state."""
        return self.producer_id == _NO_ID

    @classmethod
    def parse(cls, text: str, *, transaction_version: int | None = None) -> PreparedTxnState:
        """Parse ``"<producerId>:<epoch>"``; the empty string gives :meth:`empty`."""
        if not isinstance(text, str):
            raise InvalidPreparedStateError(f"expected a string, got {type(text).__name__}")
        if text == "":
            return cls.empty()
        producer_id, sep, epoch = text.partition(":")
        if not sep or not producer_id.isdigit() or not epoch.isdigit() or not producer_id.isascii() \
                or not epoch.isascii():
            raise InvalidPreparedStateError(f"expected '<producerId>:<epoch>' or '', got {text!r}")
        return cls(int(producer_id), int(epoch), transaction_version)

    def __str__(self) -> str:
        return "" if self.is_empty else f"{self.producer_id}:{self.epoch}"
