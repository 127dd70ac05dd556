"""moto's S3-API app served by a process that can stop serving and serve again with its data (moto keeps it in
memory, so restarting moto's own ``moto_server`` would lose it).

    python -m kafka2pc_harness.s3_server --host 127.0.0.1 --port PORT

``SIGUSR1`` stops serving: the listening socket is closed (new connections are refused) and every open connection is
shut down (a request in flight fails as when a server crashes). ``SIGUSR2`` listens again on the same port, with the
same buckets and objects. ``SIGTERM``/``SIGINT`` end the process. Each change is printed (``stopped``/``serving``)."""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import sys
import threading
from typing import Any

_CONTROL = {signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT}


def _server_class() -> Any:
    """werkzeug's threaded WSGI server, keeping the connections it serves so that they can be cut."""
    from werkzeug.serving import ThreadedWSGIServer  # noqa: PLC0415 - moto[server] (dev extra) brings werkzeug

    class CuttableServer(ThreadedWSGIServer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.connections: set[socket.socket | tuple[bytes, socket.socket]] = set()
            self.connections_lock = threading.Lock()
            super().__init__(*args, **kwargs)

        def process_request(self, request: socket.socket | tuple[bytes, socket.socket],
                            client_address: Any) -> None:
            with self.connections_lock:
                self.connections.add(request)
            super().process_request(request, client_address)

        def shutdown_request(self, request: socket.socket | tuple[bytes, socket.socket]) -> None:
            with self.connections_lock:
                self.connections.discard(request)
            super().shutdown_request(request)

        def cut(self) -> None:
            """Stop accepting, close the listening socket, and shut every open connection down."""
            self.shutdown()
            self.server_close()
            with self.connections_lock:
                open_connections = list(self.connections)
            for connection in open_connections:
                if isinstance(connection, socket.socket):  # TCP: always a socket
                    with contextlib.suppress(OSError):  # already closed by its handler
                        connection.shutdown(socket.SHUT_RDWR)

    return CuttableServer


def serve(host: str, port: int) -> int:
    """Serve moto's app on ``host:port`` until SIGTERM, stopping and resuming on SIGUSR1/SIGUSR2."""
    from moto.moto_server.werkzeug_app import (  # noqa: PLC0415 - moto[server] is a dev extra
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )

    signal.pthread_sigmask(signal.SIG_BLOCK, _CONTROL)  # before any thread: only sigwait below sees them
    app = DomainDispatcherApplication(create_backend_app)  # one app, one in-memory backend, for the process's life
    server_class = _server_class()

    def listen() -> Any:
        server = server_class(host, port, app, handler=MotoRequestHandler)
        threading.Thread(target=server.serve_forever, name="s3-server", daemon=True).start()
        print("serving", flush=True)
        return server

    server: Any = listen()
    while True:
        received = signal.sigwait(_CONTROL)
        if received == signal.SIGUSR1 and server is not None:
            server.cut()
            server = None
            print("stopped", flush=True)
        elif received == signal.SIGUSR2 and server is None:
            server = listen()
        elif received in (signal.SIGTERM, signal.SIGINT):
            if server is not None:
                server.cut()
            return 0


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module's documentation)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    return serve(args.host, args.port)


if __name__ == "__main__":
    sys.exit(main())
