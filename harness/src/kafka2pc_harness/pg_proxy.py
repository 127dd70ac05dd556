"""A loopback TCP proxy in front of a PostgreSQL server that can drop a client at its COMMIT while the server still
commits: a pooler that dropped only the client side, or a synchronous standby slow to acknowledge.

Armed with ``cut_next_commit()``, the next simple-protocol ``COMMIT`` (psycopg sends ``conn.commit()`` so) is held
back: the client's socket is closed at once, and ``commit_delay_s`` later the COMMIT reaches the server, whose answer
the proxy reads and drops before closing the server side. Every other byte passes through unchanged. Use
``sslmode=disable gssencmode=disable`` on the client: the proxy reads the protocol in the clear."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time

_UNTYPED_NEGOTIATIONS = (80877103, 80877104)  # SSLRequest, GSSENCRequest: the server answers one byte, then startup


class _Link:
    """One client connection and its server connection."""

    def __init__(self, proxy: PgProxy, client: socket.socket, server: socket.socket):
        self.proxy, self.client, self.server = proxy, client, server
        self.cut = False
        self.answered = threading.Event()  # the server answered after the cut (its COMMIT was processed)

    def start(self) -> None:
        threading.Thread(target=self._client_to_server, daemon=True, name="pg-proxy-c2s").start()
        threading.Thread(target=self._server_to_client, daemon=True, name="pg-proxy-s2c").start()

    def _client_to_server(self) -> None:
        buffer, typed = b"", False
        try:
            while True:
                data = self.client.recv(65536)
                if not data:
                    break
                buffer += data
                while True:
                    size = _message_size(buffer, typed)
                    if size is None or len(buffer) < size:
                        break
                    message, buffer = buffer[:size], buffer[size:]
                    if not typed:
                        typed = struct.unpack("!I", message[4:8])[0] not in _UNTYPED_NEGOTIATIONS
                    elif _is_commit(message) and self.proxy.take_cut():
                        self._cut(message + buffer)
                        return
                    self.server.sendall(message)
        except OSError:
            pass
        self.close()

    def _cut(self, held: bytes) -> None:
        self.cut = True
        _close(self.client)
        time.sleep(self.proxy.commit_delay_s)
        try:
            self.server.sendall(held)
            self.answered.wait(5.0)
        except OSError:
            pass
        _close(self.server)
        self.proxy.landed()

    def _server_to_client(self) -> None:
        try:
            while True:
                data = self.server.recv(65536)
                if not data:
                    break
                if self.cut:
                    if b"Z" in data:  # ReadyForQuery (or a byte of the answer before it): the COMMIT was processed
                        self.answered.set()
                    continue
                self.client.sendall(data)
        except OSError:
            pass
        self.answered.set()
        if not self.cut:
            self.close()

    def close(self) -> None:
        _close(self.client)
        _close(self.server)


def _message_size(buffer: bytes, typed: bool) -> int | None:
    """The size of the message at the start of ``buffer``, once its header is in."""
    header = 5 if typed else 4
    if len(buffer) < header:
        return None
    return int(struct.unpack("!I", buffer[header - 4:header])[0]) + (1 if typed else 0)


def _is_commit(message: bytes) -> bool:
    return message[:1] == b"Q" and message[5:].rstrip(b"\0").strip().rstrip(b";").upper() == b"COMMIT"


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


class PgProxy:
    """``PgProxy(host, port).start()``; clients connect to ``127.0.0.1:proxy.port``."""

    def __init__(self, upstream_host: str, upstream_port: int, *, commit_delay_s: float = 0.5):
        self.upstream = (upstream_host, upstream_port)
        self.commit_delay_s = commit_delay_s
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._armed = 0
        self._links: list[_Link] = []
        self._closed = threading.Event()
        self._landed = threading.Condition(self._lock)
        #: COMMITs held back and then delivered to the server
        self.commits_landed = 0

    def start(self) -> PgProxy:
        threading.Thread(target=self._accept, daemon=True, name="pg-proxy-accept").start()
        return self

    def cut_next_commit(self) -> None:
        """Drop the client of the next COMMIT, and deliver that COMMIT to the server ``commit_delay_s`` later."""
        with self._lock:
            self._armed += 1

    def take_cut(self) -> bool:
        with self._lock:
            if self._armed == 0:
                return False
            self._armed -= 1
            return True

    def landed(self) -> None:
        with self._landed:
            self.commits_landed += 1
            self._landed.notify_all()

    def wait_landed(self, count: int, timeout_s: float = 10.0) -> bool:
        """Whether ``count`` held-back COMMITs have reached the server within ``timeout_s``."""
        with self._landed:
            return self._landed.wait_for(lambda: self.commits_landed >= count, timeout_s)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                _close(client)
                continue
            server.settimeout(None)
            client.settimeout(None)
            link = _Link(self, client, server)
            with self._lock:
                self._links.append(link)
            link.start()

    def close(self) -> None:
        self._closed.set()
        _close(self._listener)
        with self._lock:
            links = list(self._links)
        for link in links:
            link.close()

    def __enter__(self) -> PgProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
