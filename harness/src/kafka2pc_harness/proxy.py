"""A fault-injecting loopback TCP proxy in front of real Kafka brokers, for tests.

``FaultProxy(upstream_bootstrap="127.0.0.1:9092")`` listens on one loopback port per upstream broker and rewrites
the broker addresses in Metadata, FindCoordinator and DescribeCluster responses to its own ports, so a client that
bootstraps through it never bypasses it. Rules then act on chosen requests or responses::

    with FaultProxy(kafka.bootstrap_servers) as proxy:
        rule = proxy.on_response(EndTxnRequest, action=DROP)   # the broker commits, the client never hears of it
        ...  # a client with bootstrap.servers=proxy.bootstrap_servers
        assert rule.fired.wait(10)

The asyncio loop runs on a daemon thread; every public method is synchronous and thread-safe. Plaintext only:
TLS cannot be read, and SASL is supported only with SaslAuthenticate requests (SaslHandshake v1+).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import socket
import threading
import time
from collections.abc import Coroutine
from typing import Any, Final, Literal, TypeVar

import attrs

from kafka2pc_harness.proxy_wire import (
    MAX_FRAME_BYTES,
    PendingRequests,
    WireError,
    api_key_of,
    length_prefix,
    parse_request,
    read_frame,
    response_correlation_id,
    rewrite_response,
)

log = logging.getLogger(__name__)
_T = TypeVar("_T")

LOOPBACK: Final = "127.0.0.1"
MAX_NODES: Final = 64
MAX_CONNECTIONS: Final = 1024
MAX_RULES: Final = 1024
MAX_DELAY_S: Final = 300.0
_QUEUED_FRAMES = 256  # per direction and connection; a full queue stops reading from the sender
_MAX_ERRORS = 100
_CALL_TIMEOUT_S = 30.0

Direction = Literal["request", "response"]


@attrs.frozen
class Drop:
    """Swallow the message and keep the connection open: the client waits until its request times out."""


@attrs.frozen
class Cut:
    """Close the client's connection and the upstream one instead of forwarding the message."""


def _delay_in_range(_instance: object, _attribute: object, value: float) -> None:
    if not 0 <= value <= MAX_DELAY_S:
        raise ValueError(f"a delay must be between 0 and {MAX_DELAY_S:g} s, not {value!r}")


@attrs.frozen
class Delay:
    """Forward the message ``seconds`` later; later messages of the same connection and direction wait behind it."""

    seconds: float = attrs.field(converter=float, validator=_delay_in_range)


Action = Drop | Cut | Delay
DROP: Final = Drop()
CUT: Final = Cut()
DELAY = Delay  # DELAY(2.0), read like DROP and CUT


@attrs.frozen
class ProxiedNode:
    """One broker behind the proxy: its node id, the address clients get, and the broker's own address."""

    node_id: int
    address: str
    upstream: str
    blackholed: bool


class FaultRule:
    """Applies ``action`` to the ``nth`` matching message (and the ``times - 1`` after it; every one from the
    ``nth`` on when ``times`` is None), counted over all connections of the proxy from when the rule is added.

    ``fired`` is set when the action is first applied; ``fire_count`` says how often it was.
    """

    def __init__(self, direction: Direction, api_key: int, *, nth: int, action: Action, times: int | None,
                 node_id: int | None) -> None:
        if nth < 1:
            raise ValueError(f"nth counts from 1, not {nth}")
        if times is not None and times < 1:
            raise ValueError(f"times must be at least 1 (or None for every one), not {times}")
        if not isinstance(action, Drop | Cut | Delay):
            raise TypeError(f"the action must be DROP, CUT or DELAY(seconds), not {action!r}")
        self.direction: Final = direction
        self.api_key: Final = api_key
        self.nth: Final = nth
        self.action: Final[Action] = action
        self.times: Final = times
        self.node_id: Final = node_id
        self.fired = threading.Event()
        self._seen = 0
        self._fire_count = 0

    @property
    def seen(self) -> int:
        """Matching messages counted so far."""
        return self._seen

    @property
    def fire_count(self) -> int:
        """How many messages the action was applied to."""
        return self._fire_count

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the rule to fire; True if it has."""
        return self.fired.wait(timeout)

    def _count(self, direction: Direction, api_key: int, node_id: int | None) -> bool:
        """Count one message (under the rule book's lock); True if the action applies to it."""
        if direction != self.direction or api_key != self.api_key:
            return False
        if self.node_id is not None and node_id != self.node_id:
            return False
        self._seen += 1
        return self._seen >= self.nth and (self.times is None or self._seen < self.nth + self.times)

    def _fire(self) -> None:
        self._fire_count += 1
        self.fired.set()

    def __repr__(self) -> str:
        node = f", node_id={self.node_id}" if self.node_id is not None else ""
        return (f"FaultRule({self.direction} api_key={self.api_key}, nth={self.nth}, {self.action}, "
                f"times={self.times}{node}, fired {self._fire_count}x)")


class _RuleBook:
    """The proxy's rules, matched in the order they were added; shared by the test thread and the loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[FaultRule] = []

    def add(self, rule: FaultRule) -> FaultRule:
        with self._lock:
            if len(self._rules) >= MAX_RULES:
                raise RuntimeError(f"more than {MAX_RULES} rules; remove the ones that are done")
            self._rules.append(rule)
        return rule

    def remove(self, rule: FaultRule) -> None:
        with self._lock:
            if rule in self._rules:
                self._rules.remove(rule)

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def match(self, direction: Direction, api_key: int, node_id: int | None) -> Action | None:
        """The action for one message. Every matching rule counts it; when several are due, the one added first
        applies and only it fires."""
        chosen: FaultRule | None = None
        with self._lock:
            for rule in self._rules:
                if rule._count(direction, api_key, node_id) and chosen is None:
                    chosen = rule
            if chosen is not None:
                chosen._fire()
        return chosen.action if chosen is not None else None


class _Stats:
    """Counters readable from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: collections.Counter[int] = collections.Counter()
        self.responses: collections.Counter[int] = collections.Counter()
        self.refused = 0
        self.errors: collections.deque[str] = collections.deque(maxlen=_MAX_ERRORS)

    def count(self, counter: collections.Counter[int], api_key: int) -> None:
        with self._lock:
            counter[api_key] += 1

    def get(self, counter: collections.Counter[int], api_key: int) -> int:
        with self._lock:
            return counter[api_key]

    def note_refused(self) -> None:
        with self._lock:
            self.refused += 1

    def error(self, message: str) -> None:
        log.warning("fault proxy: %s", message)
        with self._lock:
            self.errors.append(message)

    def error_list(self) -> list[str]:
        with self._lock:
            return list(self.errors)


class _Outbox:
    """Frames waiting to be written to one socket, in order, each not before its release time (bounded)."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(_QUEUED_FRAMES)

    async def put(self, payload: bytes, action: Action | None) -> None:
        delay = action.seconds if isinstance(action, Delay) else 0.0
        await self._queue.put((time.monotonic() + delay, payload))

    async def run(self) -> None:
        while True:
            release_at, payload = await self._queue.get()
            wait = release_at - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            self._writer.writelines((length_prefix(payload), payload))
            await self._writer.drain()


@attrs.define(eq=False)
class _Listener:
    """One loopback port and the broker behind it (node id None until a response names the node)."""

    sock: socket.socket
    upstream: tuple[str, int]
    node_id: int | None
    server: asyncio.Server | None = None
    serving: asyncio.Task[None] | None = None
    connections: set[_Connection] = attrs.field(factory=set)

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])


async def _close_writer(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError, TimeoutError):
        await asyncio.wait_for(writer.wait_closed(), 1.0)


class _Connection:
    """One client connection and its upstream connection: two readers applying the rules, two outboxes."""

    def __init__(self, core: _ProxyCore, listener: _Listener, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self._core = core
        self._listener = listener
        self._client_reader = reader
        self._client_writer = writer
        self._pending = PendingRequests()
        self._task: asyncio.Task[Any] | None = None

    async def run(self) -> None:
        """Proxy until either side closes, a CUT fires, or :meth:`close`."""
        self._task = asyncio.current_task()
        writers = [self._client_writer]
        tasks: list[asyncio.Task[None]] = []
        try:
            host, port = self._listener.upstream
            try:
                async with asyncio.timeout(self._core.connect_timeout_s):
                    up_reader, up_writer = await asyncio.open_connection(host, port)
            except (OSError, TimeoutError) as exc:
                log.debug("fault proxy: cannot connect to %s:%s: %r", host, port, exc)
                return
            writers.append(up_writer)
            to_broker, to_client = _Outbox(up_writer), _Outbox(self._client_writer)
            tasks = [asyncio.create_task(self._requests(to_broker)), asyncio.create_task(to_broker.run()),
                     asyncio.create_task(self._responses(up_reader, to_client)), asyncio.create_task(to_client.run())]
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                error = None if task.cancelled() else task.exception()
                if isinstance(error, OSError):
                    log.debug("fault proxy: connection ended: %r", error)
                elif error is not None:
                    self._core.stats.error(f"connection to node {self._listener.node_id} failed: {error!r}")
        finally:
            for writer in writers:  # before any await, so that a second cancellation cannot leak a socket
                writer.close()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.gather(*(_close_writer(writer) for writer in writers))

    async def close(self) -> None:
        """Close both sockets and wait (briefly) until they are."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.wait([self._task], timeout=5.0)

    async def _requests(self, to_broker: _Outbox) -> None:
        while True:
            payload = await read_frame(self._client_reader, self._core.max_frame_bytes)
            if payload is None:
                return
            request = parse_request(payload)
            action: Action | None = None
            if request is not None:
                self._core.stats.count(self._core.stats.requests, request.api_key)
                action = self._core.rules.match("request", request.api_key, self._listener.node_id)
                if isinstance(action, Cut):
                    return
                if isinstance(action, Drop):
                    continue
                self._pending.add(request)
            await to_broker.put(payload, action)

    async def _responses(self, reader: asyncio.StreamReader, to_client: _Outbox) -> None:
        while True:
            payload = await read_frame(reader, self._core.max_frame_bytes)
            if payload is None:
                return
            correlation_id = response_correlation_id(payload)
            request = self._pending.pop(correlation_id) if correlation_id is not None else None
            if request is None:
                self._core.stats.error(f"a response with unknown correlation id {correlation_id} was passed on")
                await to_client.put(payload, None)
                continue
            self._core.stats.count(self._core.stats.responses, request.api_key)
            action = self._core.rules.match("response", request.api_key, self._listener.node_id)
            if isinstance(action, Cut):
                return
            if isinstance(action, Drop):
                continue
            await to_client.put(rewrite_response(request, payload, self._core.translate), action)


class _ProxyCore:
    """The loop-side state: listeners by node, blackholes, connections. Used only on the loop's thread."""

    def __init__(self, upstreams: list[tuple[str, int]], rules: _RuleBook, stats: _Stats, *,
                 connect_timeout_s: float, max_frame_bytes: int) -> None:
        self.rules = rules
        self.stats = stats
        self.connect_timeout_s = connect_timeout_s
        self.max_frame_bytes = max_frame_bytes
        self._upstreams = upstreams
        self._listeners: list[_Listener] = []
        self._by_node: dict[int, _Listener] = {}
        self._blackholed: set[int] = set()
        self._all_blackholed = False
        self._closing = False

    async def start(self) -> list[int]:
        """Open a listener per bootstrap address; returns their ports."""
        ports = [self._open_listener(upstream, None).port for upstream in self._upstreams]
        await asyncio.gather(*(listener.serving for listener in self._listeners if listener.serving))
        return ports

    def _open_listener(self, upstream: tuple[str, int], node_id: int | None) -> _Listener:
        # Synchronous so that translate() can hand out the port at once: the socket listens from here on and the
        # kernel queues connections until the server task accepts them.
        if len(self._listeners) >= len(self._upstreams) + MAX_NODES:
            raise WireError(f"more than {MAX_NODES} brokers to proxy")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((LOOPBACK, 0))
        sock.listen(128)
        sock.setblocking(False)
        listener = _Listener(sock, upstream, node_id)
        listener.serving = asyncio.get_running_loop().create_task(self._serve(listener))
        self._listeners.append(listener)
        return listener

    async def _serve(self, listener: _Listener) -> None:
        listener.server = await asyncio.start_server(functools.partial(self._accept, listener), sock=listener.sock)

    def _blocked(self, listener: _Listener) -> bool:
        return self._all_blackholed or (listener.node_id is not None and listener.node_id in self._blackholed)

    async def _accept(self, listener: _Listener, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        open_now = sum(len(each.connections) for each in self._listeners)
        if self._closing or self._blocked(listener) or open_now >= MAX_CONNECTIONS:
            self.stats.note_refused()
            await _close_writer(writer)
            return
        connection = _Connection(self, listener, reader, writer)
        listener.connections.add(connection)
        try:
            await connection.run()
        except asyncio.CancelledError:
            pass  # closed by blackhole() or close(); this task ends here
        finally:
            listener.connections.discard(connection)

    def translate(self, node_id: int, host: str, port: int) -> tuple[str, int]:
        """The proxy address to advertise for a broker, opening a listener for a broker not seen before."""
        listener = self._by_node.get(node_id)
        if listener is None:
            listener = next((each for each in self._listeners
                             if each.node_id is None and each.upstream == (host, port)), None)
            if listener is None:
                listener = self._open_listener((host, port), node_id)
            listener.node_id = node_id
            self._by_node[node_id] = listener
        elif listener.upstream != (host, port):
            log.info("fault proxy: node %d moved to %s:%d", node_id, host, port)
            listener.upstream = (host, port)
        return LOOPBACK, listener.port

    def nodes(self) -> list[ProxiedNode]:
        return [ProxiedNode(node_id, f"{LOOPBACK}:{listener.port}", "{}:{}".format(*listener.upstream),
                            self._blocked(listener)) for node_id, listener in sorted(self._by_node.items())]

    def open_connections(self) -> int:
        return sum(len(listener.connections) for listener in self._listeners)

    async def blackhole(self, node_id: int | None) -> None:
        if node_id is None:
            self._all_blackholed = True
            targets = list(self._listeners)
        else:
            if node_id not in self._by_node:
                raise KeyError(f"node {node_id} is not known to the proxy (known: {sorted(self._by_node)})")
            self._blackholed.add(node_id)
            targets = [self._by_node[node_id]]
        await asyncio.gather(*(connection.close() for listener in targets for connection in list(listener.connections)))

    async def restore(self, node_id: int | None) -> None:
        if node_id is None:
            self._all_blackholed = False
            self._blackholed.clear()
        else:
            self._blackholed.discard(node_id)

    async def close(self) -> None:
        self._closing = True
        for listener in self._listeners:
            if listener.serving is not None:
                await asyncio.wait([listener.serving], timeout=5.0)
            if listener.server is not None:
                listener.server.close()
            listener.sock.close()
        await asyncio.gather(*(connection.close() for listener in self._listeners
                               for connection in list(listener.connections)))
        # Connections accepted meanwhile see _closing and close their socket; cancelling them before they run
        # would leak it. Only what is still running after a bounded wait is cancelled.
        others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        if others:
            _, stuck = await asyncio.wait(others, timeout=5.0)
            for task in stuck:
                task.cancel()
            if stuck:
                await asyncio.wait(stuck, timeout=1.0)


def _parse_servers(servers: str) -> list[tuple[str, int]]:
    parsed: list[tuple[str, int]] = []
    for entry in filter(None, (part.strip() for part in servers.split(","))):
        host, sep, port = entry.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"not a host:port address: {entry!r}")
        parsed.append((host.strip("[]"), int(port)))
    if not parsed:
        raise ValueError("upstream_bootstrap names no broker")
    return parsed


class FaultProxy:
    """A fault-injecting loopback proxy in front of a real Kafka cluster; see the module docstring."""

    def __init__(self, upstream_bootstrap: str, *, connect_timeout_s: float = 10.0,
                 max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self.upstream_bootstrap = upstream_bootstrap
        self._upstreams = _parse_servers(upstream_bootstrap)
        self._connect_timeout_s = connect_timeout_s
        self._max_frame_bytes = max_frame_bytes
        self._rules = _RuleBook()
        self._stats = _Stats()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._core: _ProxyCore | None = None
        self._ports: list[int] = []

    # -- lifecycle ---------------------------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        """Start listening; returns the proxy."""
        if self._loop is not None:
            raise RuntimeError("the proxy was already started")
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="kafka2pc-fault-proxy", daemon=True)
        self._thread.start()
        try:
            self._core = self._call(self._make_core())
            self._ports = self._call(self._core.start())
        except BaseException:
            self.close()
            raise
        return self

    async def _make_core(self) -> _ProxyCore:
        return _ProxyCore(self._upstreams, self._rules, self._stats, connect_timeout_s=self._connect_timeout_s,
                          max_frame_bytes=self._max_frame_bytes)

    def close(self) -> None:
        """Close every connection and listener and stop the loop's thread. Idempotent."""
        loop, thread, core = self._loop, self._thread, self._core
        if loop is None or thread is None or loop.is_closed():
            return
        try:
            if core is not None and loop.is_running():
                self._call(core.close())
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10.0)
            if not thread.is_alive():
                loop.close()

    def __enter__(self) -> FaultProxy:
        return self if self._loop is not None else self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _call(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        loop = self._loop
        if loop is None or loop.is_closed():
            coroutine.close()
            raise RuntimeError("the proxy is not running")
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result(_CALL_TIMEOUT_S)

    def _running_core(self) -> _ProxyCore:
        if self._core is None:
            raise RuntimeError("the proxy is not running; call start()")
        return self._core

    # -- addresses ---------------------------------------------------------------------------------------------

    @property
    def bootstrap_servers(self) -> str:
        """``127.0.0.1:<port>`` (comma separated if the upstream bootstrap named several brokers)."""
        if not self._ports:
            raise RuntimeError("the proxy is not running; call start()")
        return ",".join(f"{LOOPBACK}:{port}" for port in self._ports)

    def nodes(self) -> list[ProxiedNode]:
        """The brokers learned from responses so far, by node id."""
        core = self._running_core()

        async def snapshot() -> list[ProxiedNode]:
            return core.nodes()

        return self._call(snapshot())

    # -- faults ------------------------------------------------------------------------------------------------

    def on_request(self, api_key: int | type, nth: int = 1, *, action: Action, times: int | None = 1,
                   node_id: int | None = None) -> FaultRule:
        """Apply ``action`` to the ``nth`` request of ``api_key`` before it reaches the broker (DROP: the broker
        never sees it). ``node_id`` limits the rule to connections to that broker."""
        return self._rules.add(FaultRule("request", api_key_of(api_key), nth=nth, action=action, times=times,
                                         node_id=node_id))

    def on_response(self, api_key: int | type, nth: int = 1, *, action: Action, times: int | None = 1,
                    node_id: int | None = None) -> FaultRule:
        """Apply ``action`` to the ``nth`` response to an ``api_key`` request: the broker has acted on the request,
        and the client gets the answer late (DELAY), never (DROP) or loses the connection (CUT). Responses are
        counted as they arrive over all connections; on a single connection that is the ``nth`` request's."""
        return self._rules.add(FaultRule("response", api_key_of(api_key), nth=nth, action=action, times=times,
                                         node_id=node_id))

    def remove_rule(self, rule: FaultRule) -> None:
        """Stop applying ``rule``."""
        self._rules.remove(rule)

    def clear_rules(self) -> None:
        """Remove every rule."""
        self._rules.clear()

    def blackhole(self, node_id: int | None = None) -> None:
        """Make one broker (every one, and any learned later, when None) unreachable: its connections are closed
        now, and new ones are closed as soon as they are accepted, until :meth:`restore`."""
        self._call(self._running_core().blackhole(node_id))

    def restore(self, node_id: int | None = None) -> None:
        """Make a blackholed broker reachable again. None lifts every blackhole; a node id only undoes
        ``blackhole(node_id)``, not ``blackhole()``."""
        self._call(self._running_core().restore(node_id))

    # -- observations ------------------------------------------------------------------------------------------

    def requests_seen(self, api_key: int | type) -> int:
        """Requests of ``api_key`` clients have sent through the proxy (dropped ones included)."""
        return self._stats.get(self._stats.requests, api_key_of(api_key))

    def responses_seen(self, api_key: int | type) -> int:
        """Responses to ``api_key`` requests the brokers have sent back (dropped ones included)."""
        return self._stats.get(self._stats.responses, api_key_of(api_key))

    def open_connections(self) -> int:
        """Client connections being proxied now."""
        core = self._running_core()

        async def count() -> int:
            return core.open_connections()

        return self._call(count())

    @property
    def refused_connections(self) -> int:
        """Connections closed on arrival because their broker was blackholed (or the proxy was full)."""
        return self._stats.refused

    @property
    def errors(self) -> list[str]:
        """What went wrong inside the proxy (the last 100): unreadable frames, responses it could not rewrite.
        A test should expect none."""
        return self._stats.error_list()
