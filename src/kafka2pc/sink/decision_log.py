"""Where the coordinator durably records what it decided, before completing any transaction of it."""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Protocol

import attrs

from kafka2pc.errors import (
    CommandRefusedError,
    DecisionConflictError,
    DecisionLogCorruptError,
    StorageUnavailableError,
)
from kafka2pc.sink.naming import TransactionalIdGrammar
from kafka2pc.sink.prepared import PreparedTransaction
from kafka2pc.sink.storage import Folder, open_folder

FORMAT = "kafka2pc.decision/1"
#: how long a decision's create is sent again while the store gives no definite answer (seconds)
CREATE_RETRY_S = 30.0
_log = logging.getLogger(__name__)
_DECISION_FILE = re.compile(r"(\d{20})\.decision\.json")
_DONE_FILE = re.compile(r"(\d{20})\.done")


def _as_tuple(items: Iterable[PreparedTransaction]) -> tuple[PreparedTransaction, ...]:
    return tuple(items)


def _frozen(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping))


@attrs.frozen
class Decision:
    """Checkpoint ``checkpoint`` commits ``transactions``. ``metadata`` is the engine's own (JSON-ready) data."""

    checkpoint: int = attrs.field(validator=attrs.validators.instance_of(int))
    transactions: tuple[PreparedTransaction, ...] = attrs.field(converter=_as_tuple)
    metadata: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen)


class DecisionLog(Protocol):
    """What the committer needs from durable storage. Implementations must make :meth:`record` durable before it
    returns, and must fail loudly on records they cannot read."""

    def record(self, decision: Decision) -> None:
        """Durably store ``decision`` (not yet done). Recording the same decision again is a no-op; a different
        decision for a recorded checkpoint, or a checkpoint below the last recorded one, raises
        :class:`DecisionConflictError`."""

    def mark_done(self, checkpoint: int) -> None:
        """Durably note that every transaction of ``checkpoint`` is completed."""

    def undone(self) -> list[Decision]:
        """Recorded decisions not marked done, oldest first."""

    def last_checkpoint(self) -> int | None:
        """The highest recorded checkpoint, done or not."""

    def is_done(self, checkpoint: int) -> bool:
        """Whether ``checkpoint`` is recorded and marked done."""

    def resolve(self, checkpoint: int, reason: str, *, replay: bool = False) -> None:
        """An operator's resolution of a decision that cannot be completed (its transactions were lost, or their
        fate is unknown), kept durably with ``reason``. By default the decision then counts as done: a replay of the
        checkpoint is recognised as decided and writes nothing. ``replay=True`` abandons it instead: the checkpoint
        is undecided again, and its replay (Spark's, or the same keyed write) writes all its data anew — right only
        when none of its transactions committed."""

    def decision(self, checkpoint: int) -> Decision | None:
        """The decision of ``checkpoint`` if it is still kept."""

    def newest(self) -> Decision | None:
        """The decision of the highest checkpoint kept (abandoned ones are not kept)."""


class FileDecisionLog:
    """A decision log in a folder (local, or remote: :mod:`kafka2pc.sink.storage`): ``<checkpoint>.decision.json``
    per decision, created exclusively (the commit point), and ``<checkpoint>.done`` when it is completed. Bound to
    one transactional-id prefix; a record of another prefix is a foreign record.

    ``retain_done`` (>= 1) done decisions are kept (for audits, and to know the last checkpoint); older ones are
    deleted. None keeps all.
    """

    def __init__(self, directory: str | os.PathLike[str] | Folder, prefix: str, *, retain_done: int | None = 100):
        if retain_done is not None and retain_done < 1:
            raise ValueError("retain_done must be >= 1 (or None)")
        self.folder: Folder = open_folder(os.fspath(directory)) if isinstance(directory, (str, os.PathLike)) \
            else directory
        self.directory = self.folder.location
        self.grammar = TransactionalIdGrammar(prefix)
        self.retain_done = retain_done

    @staticmethod
    def _decision_name(checkpoint: int) -> str:
        return f"{checkpoint:020d}.decision.json"

    @staticmethod
    def _done_name(checkpoint: int) -> str:
        return f"{checkpoint:020d}.done"

    def record(self, decision: Decision) -> None:
        """See :meth:`DecisionLog.record`. Why both refusals: overwriting a recorded checkpoint would change what was
        decided after the commit point (and, were it already done, hide the new decision from :meth:`undone`); a
        checkpoint below the last recorded one may be a decided one whose record was pruned, and deciding it again
        could commit a second copy of its data."""
        for txn in decision.transactions:
            if not self.grammar.owns(txn.transactional_id):
                raise ValueError(f"{txn.transactional_id!r} is not an id of prefix {self.grammar.prefix!r}")
        body = {"format": FORMAT, "prefix": self.grammar.prefix, "checkpoint": decision.checkpoint,
                "transactions": [t.to_json() for t in decision.transactions], "metadata": dict(decision.metadata)}
        encoded = json.dumps(body, sort_keys=True).encode()
        name = self._decision_name(decision.checkpoint)
        if not self.folder.exists(name):
            last = self.last_checkpoint()
            if last is not None and decision.checkpoint < last:
                raise DecisionConflictError(f"checkpoint {decision.checkpoint} is below the last recorded checkpoint "
                                            f"{last} in {self.directory}: checkpoints never go back")
            if self._create(name, encoded):
                return
        self.decision(decision.checkpoint)  # a corrupt record raises here
        if self.folder.read(name) != encoded:
            raise DecisionConflictError(f"checkpoint {decision.checkpoint} is already recorded in {self.directory} "
                                        "with another decision; a recorded decision is never replaced")

    def _create(self, name: str, encoded: bytes) -> bool:
        """The commit point's create, sent again (the same bytes, still exclusive) while the store gives no definite
        answer, for up to :data:`CREATE_RETRY_S`: a create whose answer was lost may land later, and only a
        definite answer — created, or exists (then read back) — keeps Spark's abort() from racing it."""
        deadline, pause = time.monotonic() + CREATE_RETRY_S, 0.2
        while True:
            try:
                return self.folder.create(name, encoded)
            except StorageUnavailableError as exc:
                if time.monotonic() + pause > deadline:
                    raise
                _log.warning("%s: no definite answer to creating %s (%s); sending it again in %.1f s", self.directory,
                             name, exc, pause)
                time.sleep(pause)
                pause = min(2 * pause, 2.0)

    def mark_done(self, checkpoint: int) -> None:
        if not self.folder.exists(self._decision_name(checkpoint)):
            raise DecisionLogCorruptError(f"cannot mark checkpoint {checkpoint} done: no decision in {self.directory}")
        self.folder.create(self._done_name(checkpoint), b"")  # an existing mark is as good
        self._prune()

    def _checkpoints(self) -> tuple[list[int], set[int]]:
        decided, done = [], set()
        for name in self.folder.names():
            if match := _DECISION_FILE.fullmatch(name):
                decided.append(int(match.group(1)))
            elif match := _DONE_FILE.fullmatch(name):
                done.add(int(match.group(1)))
        return sorted(decided), done

    def _read(self, checkpoint: int) -> Decision | None:
        """The record of ``checkpoint``; None when there is none. A record that cannot be read as one of this log's
        is corrupt; a store that does not answer raises StorageUnavailableError (never read as "none")."""
        path = f"{self.directory}/{self._decision_name(checkpoint)}"
        try:
            data = self.folder.read(self._decision_name(checkpoint))
        except FileNotFoundError:
            return None
        try:
            body = json.loads(data)
            if not isinstance(body, dict) or body.get("format") != FORMAT:
                raise DecisionLogCorruptError(f"{path}: not a kafka2pc decision record (format "
                                              f"{body.get('format') if isinstance(body, dict) else None!r})")
            if body.get("prefix") != self.grammar.prefix:
                raise DecisionLogCorruptError(f"{path}: a foreign record, of prefix {body.get('prefix')!r}, in the "
                                              f"log of prefix {self.grammar.prefix!r}")
            if body.get("checkpoint") != checkpoint:
                raise DecisionLogCorruptError(f"{path}: records checkpoint {body.get('checkpoint')!r}, not "
                                              f"{checkpoint}")
            # releases before 0.1 could record an empty transaction ("state": ""): nothing to commit, skip it
            transactions = [PreparedTransaction.from_json(t) for t in body["transactions"] if t.get("state") != ""]
            for txn in transactions:
                if not self.grammar.owns(txn.transactional_id):
                    raise DecisionLogCorruptError(f"{path}: {txn.transactional_id!r} is not an id of prefix "
                                                  f"{self.grammar.prefix!r}")
            return Decision(checkpoint, transactions, body.get("metadata", {}))
        except DecisionLogCorruptError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DecisionLogCorruptError(f"{path}: unreadable decision record ({type(exc).__name__}: {exc})") \
                from exc

    def _listed(self, checkpoint: int) -> Decision:
        decision = self._read(checkpoint)
        if decision is None:
            raise DecisionLogCorruptError(f"{self.directory}: checkpoint {checkpoint} was listed, then its record "
                                          "was gone (another writer pruning or resolving this log?)")
        return decision

    def undone(self) -> list[Decision]:
        decided, done = self._checkpoints()
        return [self._listed(c) for c in decided if c not in done]

    def last_checkpoint(self) -> int | None:
        decided, _ = self._checkpoints()
        return decided[-1] if decided else None

    def decision(self, checkpoint: int) -> Decision | None:
        return self._read(checkpoint)

    def newest(self) -> Decision | None:
        decided, _ = self._checkpoints()
        return self._listed(decided[-1]) if decided else None

    def is_done(self, checkpoint: int) -> bool:
        return self.folder.exists(self._decision_name(checkpoint)) and self.folder.exists(self._done_name(checkpoint))

    @staticmethod
    def _resolved_name(checkpoint: int) -> str:
        return f"{checkpoint:020d}.resolved.json"

    def resolve(self, checkpoint: int, reason: str, *, replay: bool = False) -> None:
        """See :meth:`DecisionLog.resolve`. The reason (and, with ``replay``, the abandoned record) goes to
        ``<checkpoint>.resolved.json`` first; then the checkpoint is marked done, or (``replay``) its done mark and
        decision are deleted: a crash in between leaves it decided and stuck, and resolving again finishes."""
        if not reason.strip():
            raise ValueError("a resolution needs a reason")
        if self._read(checkpoint) is None:
            raise CommandRefusedError(f"cannot resolve checkpoint {checkpoint}: {self.directory} holds no decision of "
                                      "it (never decided, pruned, or already resolved for replay)")
        if replay:
            self.check_replayable(checkpoint)
        resolution: dict[str, Any] = {"reason": reason, "replay": replay}
        if replay:
            resolution["abandoned"] = json.loads(self.folder.read(self._decision_name(checkpoint)))
        self._add_resolution(checkpoint, resolution)
        if not replay:
            self.mark_done(checkpoint)
            return
        self.folder.delete(self._done_name(checkpoint))
        self.folder.delete(self._decision_name(checkpoint))

    def _add_resolution(self, checkpoint: int, resolution: dict[str, Any]) -> None:
        self.folder.replace(self._resolved_name(checkpoint), json.dumps(
            {"checkpoint": checkpoint, "resolutions": [*self._resolutions(checkpoint), resolution]},
            sort_keys=True).encode())

    def note_pending_replay(self, checkpoint: int, transactions: list[str]) -> None:
        """Note, before ending any of them, that ``transactions`` are being aborted to resolve ``checkpoint`` for
        replay (see :func:`~kafka2pc.sink.recovery.resolve_for_replay`)."""
        self._add_resolution(checkpoint, {"pending_replay": transactions})

    def pending_replay(self, checkpoint: int) -> list[str] | None:
        """The transactions of an unfinished resolution for replay of ``checkpoint``, if the last one is that."""
        resolutions = self._resolutions(checkpoint)
        last = resolutions[-1] if resolutions else None
        return [str(t) for t in last["pending_replay"]] if isinstance(last, dict) and "pending_replay" in last \
            else None

    def check_replayable(self, checkpoint: int) -> None:
        """Refuse (CommandRefusedError) to resolve ``checkpoint`` for replay where its replay would write twice (it
        is done) or never (it is below the last recorded checkpoint)."""
        if self.is_done(checkpoint):
            raise CommandRefusedError(f"checkpoint {checkpoint} is done (its transactions committed): resolving it "
                                      "for replay would write its rows twice")
        last = self.last_checkpoint()
        if last is not None and checkpoint < last:
            raise CommandRefusedError(f"checkpoint {checkpoint} is below the last recorded checkpoint {last}: a "
                                      "replay of it could never be recorded (checkpoints never go back); resolve it "
                                      "without replay")

    def _resolutions(self, checkpoint: int) -> list[Any]:
        """Earlier resolutions of ``checkpoint`` (each one is kept: an abandoned record is the only list of what was
        lost)."""
        try:
            body = json.loads(self.folder.read(self._resolved_name(checkpoint)))
        except FileNotFoundError:
            return []
        except ValueError:
            return [{"unreadable": True}]
        if isinstance(body, dict) and isinstance(body.get("resolutions"), list):
            return list(body["resolutions"])
        return [body]  # a resolution written before resolutions were kept as a list

    def _prune(self) -> None:
        if self.retain_done is None:
            return
        decided, done = self._checkpoints()
        finished = [c for c in decided if c in done]
        for checkpoint in finished[:-self.retain_done]:
            self.folder.delete(self._decision_name(checkpoint))
            self.folder.delete(self._done_name(checkpoint))
            self.folder.delete(self._resolved_name(checkpoint))
