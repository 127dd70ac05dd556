"""The sink's own state under the query's checkpoint location: its transactional-id prefix and the decision log.

``<checkpointLocation>/kafka2pc/sink.json`` pins the prefix on the first run (generated unless one is given; an
explicit one must match what the checkpoint holds, and may not already have transactional ids on the cluster);
``<checkpointLocation>/kafka2pc/decisions/`` is the :class:`~kafka2pc.sink.FileDecisionLog`, whose records are the
commit points of the query's batches."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

import attrs

from kafka2pc.errors import ConfigError, DecisionLogCorruptError, SinkStateMissingError
from kafka2pc.sink.decision_log import FileDecisionLog
from kafka2pc.sink.naming import TransactionalIdGrammar
from kafka2pc.sink.storage import open_folder
from kafka2pc.transaction_control import TransactionControl

FORMAT = "kafka2pc.spark/1"
SINK_DIRECTORY = "kafka2pc"
STATE_FILE = "sink.json"
#: done decisions kept for audits (a replay only ever concerns the last batch)
RETAIN_DONE = 100


@attrs.frozen
class SinkState:
    """What the checkpoint pins for the sink."""

    prefix: str
    query_id: str | None = None
    #: set once the fallback to timeout-bound transactions was announced, so it is announced once
    fallback_announced: bool = False


class SinkStore:
    """The sink's files under a checkpoint location (a local path or a remote URL: :mod:`kafka2pc.sink.storage`)."""

    def __init__(self, checkpoint_location: str):
        self.checkpoint = open_folder(checkpoint_location)
        self.folder = self.checkpoint.child(SINK_DIRECTORY)
        self.directory = self.folder.location

    @property
    def state_file(self) -> str:
        """sink.json, as a location for messages."""
        return f"{self.directory}/sink.json"

    def load(self) -> SinkState | None:
        """The pinned state, or None on the first run (only when the store says sink.json is not there: a store
        that does not answer raises :class:`~kafka2pc.errors.StorageUnavailableError`)."""
        try:
            data = self.folder.read(STATE_FILE)
        except FileNotFoundError:
            return None
        try:
            body = json.loads(data)
            if body.get("format") != FORMAT:
                raise ValueError(f"format {body.get('format')!r}")
            return SinkState(body["prefix"], body.get("query_id"), bool(body.get("fallback_announced", False)))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DecisionLogCorruptError(f"{self.state_file}: unreadable sink state ({exc})") from exc

    @staticmethod
    def _encoded(state: SinkState) -> bytes:
        return json.dumps({"format": FORMAT, **attrs.asdict(state)}, sort_keys=True).encode()

    def save(self, state: SinkState) -> None:
        """Write sink.json atomically (once it is pinned: see :meth:`pin`)."""
        self.folder.replace(STATE_FILE, self._encoded(state))

    def pin(self, state: SinkState) -> SinkState:
        """Create sink.json with ``state`` unless it exists (an exclusive create: of two first runs on one location
        one wins, and the other takes the winner's state); returns the pinned state."""
        if self.folder.create(STATE_FILE, self._encoded(state)):
            return state
        pinned = self.load()
        if pinned is None:
            raise DecisionLogCorruptError(f"{self.state_file}: it existed when created, and is gone now")
        return pinned

    def decision_log(self, prefix: str) -> FileDecisionLog:
        """The query's decision log."""
        return FileDecisionLog(self.folder.child("decisions"), prefix, retain_done=RETAIN_DONE)

    def query_id(self) -> str | None:
        """Spark's persistent query id, from the checkpoint's ``metadata`` file (streaming queries)."""
        try:
            return str(json.loads(self.checkpoint.read("metadata").decode().splitlines()[0])["id"])
        except (FileNotFoundError, ValueError, KeyError, IndexError, TypeError):
            return None

    def spark_commits(self) -> list[int]:
        """The batch ids Spark's commit log holds (a streaming query's checkpoint; empty for anything else)."""
        return [int(name) for name in self.checkpoint.child("commits").names() if name.isdigit()]

    def open(self, requested_prefix: str | None, control: Callable[[], TransactionControl]) -> SinkState:
        """The state of this checkpoint: pinned on the first run (``control()`` checks the prefix is free on the
        cluster), checked against the options on later ones."""
        state = self.load()
        if state is not None:
            return self._checked(state, requested_prefix)
        committed = self.spark_commits()
        if committed and requested_prefix is None:
            raise SinkStateMissingError(
                f"the checkpoint {self.checkpoint.location} holds Spark's progress (batches up to "
                f"{max(committed)} committed) but no kafka2pc state ({self.state_file} is missing): it was "
                "deleted, or this driver runs on a host where that path is another directory. Starting anew would "
                "pick a new transactional-id prefix and leave the old one's prepared transactions pinning the LSO, "
                "with no timeout. Run the driver "
                f"where the checkpoint's {SINK_DIRECTORY}/ folder is, or restore it. If this query never wrote "
                "with kafka2pc (it used another sink until now), pass transactionalIdPrefix to start one.")
        prefix = requested_prefix or f"kafka2pc-{uuid.uuid4().hex[:12]}"
        grammar = TransactionalIdGrammar(prefix)
        in_use = [t.transactional_id for t in control().list(pattern=f"^{grammar.pattern}$")
                  if grammar.owns(t.transactional_id)]
        if in_use:
            raise ConfigError("transactionalIdPrefix", f"{prefix!r} already has {len(in_use)} transactional ids on "
                                                       f"the cluster (e.g. {in_use[0]!r}): another query's checkpoint "
                                                       "uses it; two queries sharing a prefix would abort each "
                                                       "other's transactions")
        return self._checked(self.pin(SinkState(prefix, self.query_id())), requested_prefix)

    def _checked(self, state: SinkState, requested_prefix: str | None) -> SinkState:
        if requested_prefix is not None and requested_prefix != state.prefix:
            raise ConfigError("transactionalIdPrefix", f"{requested_prefix!r} differs from {state.prefix!r}, which "
                                                       f"the checkpoint {self.checkpoint.location} holds: a query "
                                                       "keeps its prefix (see docs/spark.md, changing the prefix)")
        return state
