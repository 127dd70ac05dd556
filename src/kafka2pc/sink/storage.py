"""Where decision logs live: a folder on the local disk, or under a remote filesystem URL (``s3://``/``s3a://``,
``gs://``, ``abfs://``/``abfss://``, ``hdfs://``).

A folder holds small whole files. Its two writes are the ones a commit point needs: :meth:`Folder.create`, an
atomic *exclusive* create (of two writers racing for one name, exactly one wins), and :meth:`Folder.replace`, an
atomic whole-file replace. Locally they are a hard link and a rename of fsynced temporary files; on S3 a PutObject
with ``If-None-Match: *`` and a plain PutObject (S3 objects are replaced whole), through s3fs; on GCS and Azure
storage the same through gcsfs (``ifGenerationMatch=0``) and adlfs (``If-None-Match: *``); on HDFS, through
WebHDFS, a complete temporary file renamed into place (HDFS renames are atomic and never overwrite). Credentials and
endpoints come from each store's standard chain (environment, profile, instance role, Hadoop's configuration), never
from kafka2pc options.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse
from xml.etree import ElementTree

from kafka2pc.errors import ConfigError, Kafka2pcError, StorageUnavailableError

#: URL schemes of the remote stores kafka2pc writes to, and the fsspec protocol serving each
REMOTE_SCHEMES = {"s3": "s3", "s3a": "s3", "gs": "gcs", "abfs": "abfs", "abfss": "abfs", "hdfs": "webhdfs"}
#: the extra that installs each protocol's fsspec filesystem
_EXTRAS = {"s3": "s3", "gcs": "gcs", "abfs": "azure", "webhdfs": "hdfs"}
#: the NameNode's WebHDFS port when Hadoop's configuration does not say (Hadoop 3's default)
WEBHDFS_DEFAULT_PORT = 9870


class Folder(Protocol):
    """A folder of small files, named relative to it."""

    @property
    def location(self) -> str:
        """The folder, as a user would write it (for messages)."""

    def child(self, name: str) -> Folder:
        """A subfolder (created on the first write into it)."""

    def exists(self, name: str) -> bool:
        """Whether file ``name`` exists."""

    def read(self, name: str) -> bytes:
        """The bytes of file ``name``; FileNotFoundError when it does not exist."""

    def create(self, name: str, data: bytes) -> bool:
        """Create file ``name`` with ``data`` unless it exists, atomically and durably; whether this call did."""

    def replace(self, name: str, data: bytes) -> None:
        """Write file ``name`` whole: a crash leaves the old content or the new one."""

    def names(self) -> list[str]:
        """The names of the files in the folder ([] when it does not exist)."""

    def delete(self, name: str) -> None:
        """Remove file ``name`` if it exists."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _durable_temporary(folder: Path, data: bytes) -> Path:
    """A new temporary file in ``folder`` holding ``data``, fsynced (removed again if writing it fails)."""
    fd, name = tempfile.mkstemp(prefix=".tmp-", dir=folder)
    temporary = Path(name)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return temporary


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a crash leaves either the old file or the new one: write a temporary file
    in the same folder, fsync it, rename it over ``path``, fsync the folder."""
    temporary = _durable_temporary(path.parent, data)
    try:
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def exclusive_write(path: Path, data: bytes) -> bool:
    """Create ``path`` with ``data`` unless it exists, atomically (a hard link of a complete, fsynced temporary
    file): of two writers racing, exactly one creates it. Returns whether this call created it."""
    temporary = _durable_temporary(path.parent, data)
    try:
        try:
            os.link(temporary, path)
        except FileExistsError:
            return False
    finally:
        temporary.unlink(missing_ok=True)
    _fsync_dir(path.parent)
    return True


#: what a store's error may say about a file itself; anything else says nothing about it (see :func:`answering`)
_ANSWERS = (FileNotFoundError, FileExistsError, PermissionError, Kafka2pcError)


@contextlib.contextmanager
def answering(location: str, what: str) -> Iterator[None]:
    """Let a store's definite answers through (not found, exists, permission denied) and turn every other failure
    (unreachable, timed out, an error status, a rename refused for a reason not given) into
    :class:`~kafka2pc.errors.StorageUnavailableError`: an outage is never read as "absent" (fsspec's generic
    ``exists()``, which WebHDFS uses, returns False on any error)."""
    try:
        yield
    except _ANSWERS:
        raise
    except Exception as exc:
        raise StorageUnavailableError(f"{location}: {what} failed ({type(exc).__name__}: {exc}); nothing was "
                                      "concluded from it: retry once the store answers") from exc


class LocalFolder:
    """A folder on a local (or mounted) filesystem."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)

    @property
    def location(self) -> str:
        return str(self.path)

    def child(self, name: str) -> LocalFolder:
        return LocalFolder(self.path / name)

    def exists(self, name: str) -> bool:
        with answering(self.location, f"looking for {name}"):
            return (self.path / name).exists()  # False only for ENOENT/ENOTDIR; an I/O error raises

    def read(self, name: str) -> bytes:
        with answering(self.location, f"reading {name}"):
            return (self.path / name).read_bytes()

    def create(self, name: str, data: bytes) -> bool:
        with answering(self.location, f"creating {name}"):
            self.path.mkdir(parents=True, exist_ok=True)
            return exclusive_write(self.path / name, data)

    def replace(self, name: str, data: bytes) -> None:
        with answering(self.location, f"writing {name}"):
            self.path.mkdir(parents=True, exist_ok=True)
            atomic_write(self.path / name, data)

    def names(self) -> list[str]:
        with answering(self.location, "listing"):
            try:
                return [entry.name for entry in self.path.iterdir()]
            except (FileNotFoundError, NotADirectoryError):
                return []

    def delete(self, name: str) -> None:
        with answering(self.location, f"deleting {name}"):
            (self.path / name).unlink(missing_ok=True)


class RemoteFolder:
    """A folder under a remote filesystem URL, through fsspec (s3fs for S3). Only a definite "not found" reads as
    absent; every other failure raises :class:`~kafka2pc.errors.StorageUnavailableError`."""

    def __init__(self, filesystem: Any, path: str, url: str):
        self.fs = filesystem
        self.path = path.rstrip("/")
        self.url = url.rstrip("/")

    @property
    def location(self) -> str:
        return self.url

    def child(self, name: str) -> RemoteFolder:
        return type(self)(self.fs, f"{self.path}/{name}", f"{self.url}/{name}")

    def _present(self, path: str) -> bool:
        # info(), not exists(): fsspec's generic exists() answers False for any error, an outage included
        with answering(self.url, f"looking for {path.rsplit('/', 1)[-1]}"):
            try:
                self.fs.info(path)
            except FileNotFoundError:
                return False
            return True

    def exists(self, name: str) -> bool:
        return self._present(f"{self.path}/{name}")

    def read(self, name: str) -> bytes:
        with answering(self.url, f"reading {name}"):
            return bytes(self.fs.cat_file(f"{self.path}/{name}"))

    def create(self, name: str, data: bytes) -> bool:
        """See :meth:`Folder.create`. False also when the store's answer was lost or unclear (S3-compatible stores
        answer a lost race with 412 lacking its ``<Condition>``, or 409 ConditionalRequestConflict) and the file is
        there now: it may be this call's own write, so callers read it back and compare."""
        try:
            with answering(self.url, f"creating {name}"):
                return self._create(name, data)
        except StorageUnavailableError:
            if self.exists(name):
                return False
            raise

    def _create(self, name: str, data: bytes) -> bool:
        try:
            self.fs.pipe_file(f"{self.path}/{name}", data, mode="create")  # S3: If-None-Match: *
        except FileExistsError:
            return False
        return True

    def replace(self, name: str, data: bytes) -> None:
        with answering(self.url, f"writing {name}"):
            self.fs.pipe_file(f"{self.path}/{name}", data)

    def names(self) -> list[str]:
        with answering(self.url, "listing"):
            try:
                return [str(entry).rsplit("/", 1)[-1] for entry in self.fs.ls(self.path, detail=False)]
            except FileNotFoundError:
                return []

    def delete(self, name: str) -> None:
        with answering(self.url, f"deleting {name}"), contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(f"{self.path}/{name}")


class HdfsFolder(RemoteFolder):
    """A folder on HDFS, through WebHDFS. A file is written whole under a temporary name, then renamed into place:
    HDFS renames are atomic and fail when the target exists, which makes :meth:`create` exclusive. :meth:`replace`
    moves the old file aside first (``<name>.old``); until the new one is in place ``<name>`` is the old one for
    every method (exists, read, names), so a crash in between loses nothing and no two methods disagree."""

    _ASIDE = ".old"

    def _temporary(self, data: bytes) -> str:
        temporary = f"{self.path}/.tmp-{uuid.uuid4().hex}"
        self.fs.pipe_file(temporary, data)
        return temporary

    def _rename(self, source: str, target: str) -> bool:
        answer = self.fs._call("RENAME", "put", source, destination=target)
        return bool(answer.json().get("boolean"))

    def exists(self, name: str) -> bool:
        return super().exists(name) or super().exists(name + self._ASIDE)

    def read(self, name: str) -> bytes:
        try:
            return super().read(name)
        except FileNotFoundError:
            return super().read(name + self._ASIDE)

    def _create(self, name: str, data: bytes) -> bool:
        self.fs.makedirs(self.path, exist_ok=True)
        temporary = self._temporary(data)
        if self._rename(temporary, f"{self.path}/{name}"):
            return True
        self.fs.rm_file(temporary)
        return False

    def replace(self, name: str, data: bytes) -> None:
        target, aside = f"{self.path}/{name}", f"{self.path}/{name}{self._ASIDE}"
        with answering(self.url, f"writing {name}"):
            self.fs.makedirs(self.path, exist_ok=True)
            temporary = self._temporary(data)
        if self._present(target):
            self._delete(aside)
            with answering(self.url, f"moving {name} aside"):
                if not self._rename(target, aside):
                    raise OSError(f"could not move {target} aside to replace it")
        with answering(self.url, f"writing {name}"):
            if not self._rename(temporary, target):
                raise OSError(f"could not rename {temporary} to {target}")
        self._delete(aside)

    def _delete(self, path: str) -> None:
        with answering(self.url, f"deleting {path.rsplit('/', 1)[-1]}"), contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(path)

    def names(self) -> list[str]:
        found = set()
        for name in super().names():
            if not name.startswith(".tmp-"):
                found.add(name.removesuffix(self._ASIDE))
        return sorted(found)

    def delete(self, name: str) -> None:
        self._delete(f"{self.path}/{name}{self._ASIDE}")
        super().delete(name)


def hadoop_setting(name: str, environment: Mapping[str, str]) -> str | None:
    """A setting of the Hadoop configuration the driver's environment points to (``core-site.xml`` and
    ``hdfs-site.xml`` in ``HADOOP_CONF_DIR``, else ``YARN_CONF_DIR``), if any."""
    for variable in ("HADOOP_CONF_DIR", "YARN_CONF_DIR"):
        folder = environment.get(variable)
        if not folder:
            continue
        for file_name in ("hdfs-site.xml", "core-site.xml"):
            try:
                root = ElementTree.parse(os.path.join(folder, file_name)).getroot()
            except (OSError, ElementTree.ParseError):
                continue
            for prop in root.iter("property"):
                if (prop.findtext("name") or "").strip() == name:
                    return (prop.findtext("value") or "").strip() or None
    return None


def _webhdfs(netloc: str, location: str, key: str) -> Any:
    """fsspec's WebHDFS client for the NameNode of ``hdfs://netloc``: its HTTP address from Hadoop's configuration
    (``dfs.namenode.http-address``), else the NameNode's host at port 9870; the user from ``HADOOP_USER_NAME``."""
    import fsspec  # type: ignore[import-untyped,import-not-found,unused-ignore]  # noqa: PLC0415 - optional, as for S3

    host = netloc.rsplit(":", 1)[0] if netloc else ""
    address = hadoop_setting("dfs.namenode.http-address", os.environ)
    if address:
        http_host, _, http_port = address.rpartition(":")
        if http_host in ("0.0.0.0", ""):
            http_host = host or "localhost"
    elif host:
        http_host, http_port = host, str(WEBHDFS_DEFAULT_PORT)
    else:
        raise ConfigError(key, f"{location!r} names no NameNode, and HADOOP_CONF_DIR gives no "
                               "dfs.namenode.http-address: write hdfs://<namenode>:<port>/path")
    user = os.environ.get("HADOOP_USER_NAME") or getpass.getuser()
    return fsspec.filesystem("webhdfs", host=http_host, port=int(http_port), user=user, use_listings_cache=False)


def open_folder(location: str, *, key: str = "checkpointLocation") -> Folder:
    """The folder at ``location``: a local path or ``file:`` URI, or a URL of a scheme in :data:`REMOTE_SCHEMES`.
    Other schemes are refused with a ConfigError naming ``key``."""
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        path = parsed.path if parsed.scheme else location
        if not path:
            raise ConfigError(key, f"{location!r} is not a path")
        return LocalFolder(os.path.abspath(path))
    protocol = REMOTE_SCHEMES.get(parsed.scheme)
    if protocol is None:
        supported = ", ".join(scheme + ":" for scheme in REMOTE_SCHEMES)
        raise ConfigError(key, f"{location!r}: {parsed.scheme}: is not supported; kafka2pc keeps its decisions on a "
                               f"local path, file:, or {supported} (see docs/spark.md)")
    if not parsed.netloc and protocol != "webhdfs":
        raise ConfigError(key, f"{location!r} names no bucket or container")
    try:
        if protocol == "webhdfs":
            return HdfsFolder(_webhdfs(parsed.netloc, location, key), parsed.path, location)
        import fsspec.core  # type: ignore[import-untyped,import-not-found,unused-ignore]  # noqa: PLC0415 - optional

        # the URL's own parts (an ABFS account in its host) reach the filesystem; no listing cache: another process
        # (a restarted driver, a racing writer) may have written since
        url = location.replace("s3a://", "s3://", 1) if parsed.scheme == "s3a" else location
        filesystem, path = fsspec.core.url_to_fs(url, use_listings_cache=False)
    except ImportError as exc:
        extra = _EXTRAS[protocol]
        raise ConfigError(key, f"{location!r} needs kafka2pc's {extra} extra (pip install 'kafka2pc[{extra}]'): "
                               f"{exc}") from None
    return RemoteFolder(filesystem, str(path), location)
