"""A store for unit tests whose outages are chosen: an fsspec filesystem over a local folder that, like WebHDFS,
has no ``exists()`` of its own (fsspec's generic one answers False on any error), and fails the calls on chosen
paths with the ConnectionError an unreachable NameNode gives."""

from __future__ import annotations

import re
from typing import Any

from fsspec.implementations.local import LocalFileSystem
from fsspec.spec import AbstractFileSystem

from kafka2pc.sink.storage import RemoteFolder


class OutageFileSystem(AbstractFileSystem):  # type: ignore[misc]
    """Every call on a path matching ``failing`` (a regex) raises ConnectionError, ``times`` times in all (None:
    until :meth:`end_outage`); everything else goes to a local folder."""

    cachable = False

    def __init__(self) -> None:
        super().__init__()
        self.local = LocalFileSystem()
        self.failing: re.Pattern[str] | None = None
        self.times: int | None = None
        self.calls: tuple[str, ...] | None = None
        self.failed: list[str] = []
        #: pipe_file on a failing path writes first, then fails: the answer of a write that landed is lost
        self.lose_answers = False

    def outage(self, paths: str, *, times: int | None = None, calls: tuple[str, ...] | None = None) -> None:
        """Calls (all, or those named in ``calls``) on paths matching ``paths`` fail, ``times`` times (None: until
        :meth:`end_outage`)."""
        self.failing, self.times, self.calls = re.compile(paths), times, calls

    def end_outage(self) -> None:
        self.failing = None

    def _check(self, call: str, path: str) -> None:
        if self.failing is None or not self.failing.search(path) or (self.calls and call not in self.calls):
            return
        if self.times is not None:
            if self.times <= 0:
                return
            self.times -= 1
        self.failed.append(f"{call} {path.rsplit('/', 1)[-1]}")
        raise ConnectionError(f"HTTPConnectionPool(host='127.0.0.1', port=9870): Max retries exceeded ({call})")

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        self._check("info", path)
        return dict(self.local.info(path, **kwargs))

    def cat_file(self, path: str, start: Any = None, end: Any = None, **kwargs: Any) -> bytes:
        self._check("cat_file", path)
        return bytes(self.local.cat_file(path, start=start, end=end, **kwargs))

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        if self.lose_answers:
            self._write(path, value, mode)
        self._check("pipe_file", path)
        self._write(path, value, mode)

    def _write(self, path: str, value: bytes, mode: str) -> None:
        self.local.makedirs(self.local._parent(path), exist_ok=True)
        if mode == "create":
            with open(path, "xb") as handle:  # an exclusive create, as S3's If-None-Match: *
                handle.write(value)
            return
        self.local.pipe_file(path, value)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        self._check("ls", path)
        return list(self.local.ls(path, detail=detail, **kwargs))

    def rm_file(self, path: str) -> None:
        self._check("rm_file", path)
        self.local.rm_file(path)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        self.local.makedirs(path, exist_ok=exist_ok)


def outage_folder(root: str) -> tuple[OutageFileSystem, RemoteFolder]:
    """A folder at ``root`` (a local path) on a store whose outages the test chooses."""
    filesystem = OutageFileSystem()
    return filesystem, RemoteFolder(filesystem, root, f"hdfs://namenode{root}")
