"""Idempotent writes, keyed as Delta Lake keys them: a write says who it is (``app_id``, a stable id of the writing
application) and which of its writes it is (``version``, increasing, typically a micro-batch id). A write whose key
is already decided writes nothing; that is what makes a replayed foreachBatch exactly-once.

Every decision carries the last decided version of every application that wrote through its log
(:data:`METADATA_KEY` in its metadata), so the newest decision alone answers: older ones may have been pruned.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

import attrs

from kafka2pc.errors import ConfigError, StaleWriteVersionError, WriteKeyInUseError
from kafka2pc.sink.decision_log import Decision

#: the decision metadata entry that maps app ids to their last decided version
METADATA_KEY = "write_versions"
#: the decision metadata entry that maps app ids to the streaming query whose write decided that version
ORIGINS_KEY = "write_origins"
_MAX_APP_ID = 255


def _app_id(instance: WriteKey, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not value.strip() or len(value) > _MAX_APP_ID:
        raise ConfigError("txnAppId", f"must be a non-empty string of at most {_MAX_APP_ID} characters")


def _version(instance: WriteKey, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError("txnVersion", f"must be an integer >= 0, got {value!r}")


@attrs.frozen
class WriteKey:
    """Which write of which application this is."""

    app_id: str = attrs.field(validator=_app_id)
    version: int = attrs.field(validator=_version)


class Verdict(enum.Enum):
    """What a keyed write does."""

    WRITE = "write"
    #: its key is decided already (a replay): write nothing
    ALREADY_DECIDED = "already decided"


def decided_versions(decision: Decision | None) -> dict[str, int]:
    """The last decided version of each application, as of ``decision`` (the log's newest one)."""
    if decision is None:
        return {}
    versions = decision.metadata.get(METADATA_KEY) or {}
    return {str(app): int(version) for app, version in versions.items()}


def verdict(versions: Mapping[str, int], key: WriteKey, *, where: str) -> Verdict:
    """WRITE for a version above the application's last decided one, ALREADY_DECIDED for that very version.

    A lower version raises :class:`~kafka2pc.errors.StaleWriteVersionError` rather than being skipped: in a
    foreachBatch a replay repeats the last version, never an older one, so a lower version means two applications
    share one ``txnAppId`` (skipping would drop the other's rows without a word) or the query's checkpoint went back
    (its rows were written already, and the operator should know)."""
    last = versions.get(key.app_id)
    if last is None or key.version > last:
        return Verdict.WRITE
    if key.version == last:
        return Verdict.ALREADY_DECIDED
    raise StaleWriteVersionError(
        f"txnVersion {key.version} of txnAppId {key.app_id!r} is below the last decided one ({last}) at {where}: "
        "refused, nothing written. Versions must increase: give each application (each query writing here) its own "
        "txnAppId; if the query's checkpoint was restored from an older copy, its rows up to version "
        f"{last} are in Kafka already.")


def decided_origins(decision: Decision | None) -> dict[str, str]:
    """The streaming query that decided each application's last version, as of ``decision`` (where known)."""
    origins = (decision.metadata.get(ORIGINS_KEY) or {}) if decision is not None else {}
    return {str(app): str(query) for app, query in origins.items()}


def check_origin(origins: Mapping[str, str], key: WriteKey, origin: str | None, *, where: str) -> None:
    """Refuse a keyed write from another streaming query than the one that decided its application's last version:
    two queries share one ``txnAppId``, and the second one's rows would be skipped (an equal version) or interleaved
    with the first's (a higher one). Where either query is unknown (a write outside a streaming query, a decision
    recorded before origins were), nothing can be told apart and nothing is refused."""
    recorded = origins.get(key.app_id)
    if recorded is None or origin is None or recorded == origin:
        return
    raise WriteKeyInUseError(
        f"txnAppId {key.app_id!r} at {where} was last decided by streaming query {recorded}; this write (txnVersion "
        f"{key.version}) comes from query {origin}: refused, nothing written. Two queries share one txnAppId: give "
        "each its own (a query restarted from its checkpoint keeps its id; one started without it gets a new one).")


def with_origin(origins: Mapping[str, str], key: WriteKey | None, origin: str | None) -> dict[str, str]:
    """The origins to carry in the next decision: ``origins`` plus ``key``'s, where known."""
    carried = dict(origins)
    if key is not None:
        if origin is None:
            carried.pop(key.app_id, None)
        else:
            carried[key.app_id] = origin
    return carried


def with_decided(versions: Mapping[str, int], key: WriteKey | None) -> dict[str, int]:
    """The versions to carry in the next decision: ``versions`` plus ``key``."""
    carried = dict(versions)
    if key is not None:
        carried[key.app_id] = key.version
    return carried
