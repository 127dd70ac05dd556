"""Kafka framing for :mod:`kafka2pc_harness.proxy`, and the rewriting of the broker addresses that responses carry.

A frame is a 4-byte big-endian length and that many bytes. A request starts with api_key (int16), api_version
(int16) and correlation_id (int32) in every header version; a response starts with the correlation_id. Only the
responses that advertise broker addresses are decoded, with kafka-python's generated protocol classes.
"""

from __future__ import annotations

import asyncio
import struct
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final

import attrs
from kafka.protocol.admin import DescribeClusterResponse
from kafka.protocol.metadata import ApiVersionsResponse, FindCoordinatorResponse, MetadataResponse

#: Kafka's own default limit (socket.request.max.bytes) is 100 MiB; fetch responses stay below fetch.max.bytes.
MAX_FRAME_BYTES: Final = 128 * 1024 * 1024
#: Requests awaiting a response on one connection; librdkafka's own in-flight limit is far lower in practice.
MAX_PENDING_REQUESTS: Final = 65_536

_LENGTH = struct.Struct(">i")
_REQUEST_START = struct.Struct(">hhi")
_CORRELATION_ID = struct.Struct(">i")

#: (node id, advertised host, advertised port) -> (host, port) the client should use instead.
Translate = Callable[[int, str, int], tuple[str, int]]

_DESCRIBE_CLUSTER_CONTROLLERS = 2  # DescribeCluster v1+ EndpointType: 1 brokers, 2 controllers

#: The responses whose addresses are rewritten, by api key; ApiVersions is capped to the versions they can decode.
ADDRESS_RESPONSES: Final[dict[int, Any]] = {
    int(MetadataResponse.API_KEY): MetadataResponse,
    int(FindCoordinatorResponse.API_KEY): FindCoordinatorResponse,
    int(DescribeClusterResponse.API_KEY): DescribeClusterResponse,
}
API_VERSIONS_KEY: Final = int(ApiVersionsResponse.API_KEY)


class WireError(Exception):
    """A frame the proxy cannot handle: too large, cut short, or a response it failed to rewrite."""


@attrs.frozen
class RequestInfo:
    """The fixed start of a request header."""

    api_key: int
    api_version: int
    correlation_id: int


def api_key_of(api: int | type) -> int:
    """The api key of ``api``: an int, or a kafka-python request/response class (e.g. ``EndTxnRequest``)."""
    key = api if isinstance(api, int) else getattr(api, "API_KEY", None)
    if not isinstance(key, int):
        raise TypeError(f"{api!r} is neither an api key nor a kafka-python protocol class")
    if not 0 <= key < 2**15:
        raise ValueError(f"api key {key} is out of range")
    return key


def parse_request(payload: bytes) -> RequestInfo | None:
    """The api key, version and correlation id of a request frame's payload; None if it is too short."""
    if len(payload) < _REQUEST_START.size:
        return None
    return RequestInfo(*_REQUEST_START.unpack_from(payload))


def response_correlation_id(payload: bytes) -> int | None:
    """The correlation id a response frame's payload starts with; None if it is too short."""
    if len(payload) < _CORRELATION_ID.size:
        return None
    return int(_CORRELATION_ID.unpack_from(payload)[0])


async def read_frame(reader: asyncio.StreamReader, max_bytes: int = MAX_FRAME_BYTES) -> bytes | None:
    """The payload of the next frame, or None when the peer closed the connection between frames."""
    try:
        prefix = await reader.readexactly(_LENGTH.size)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise WireError("connection closed inside a frame's length") from exc
        return None
    (size,) = _LENGTH.unpack(prefix)
    if not 0 <= size <= max_bytes:
        raise WireError(f"frame of {size} bytes (limit {max_bytes})")
    try:
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError as exc:
        raise WireError(f"connection closed after {len(exc.partial)} of a frame's {size} bytes") from exc


def length_prefix(payload: bytes) -> bytes:
    """The 4-byte length that frames ``payload``."""
    return _LENGTH.pack(len(payload))


class PendingRequests:
    """Per connection: the requests still awaiting a response, by correlation id, oldest first (bounded)."""

    def __init__(self, limit: int = MAX_PENDING_REQUESTS) -> None:
        self._limit = limit
        self._requests: OrderedDict[int, RequestInfo] = OrderedDict()

    def __len__(self) -> int:
        return len(self._requests)

    def add(self, request: RequestInfo) -> None:
        """Remember ``request`` until its response arrives."""
        self._requests[request.correlation_id] = request
        self._requests.move_to_end(request.correlation_id)
        while len(self._requests) > self._limit:
            self._requests.popitem(last=False)

    def discard(self, correlation_id: int) -> None:
        """Forget a request that will get no response (the proxy dropped it)."""
        self._requests.pop(correlation_id, None)

    def pop(self, correlation_id: int) -> RequestInfo | None:
        """The request a response answers, or None if unknown.

        A broker answers a connection's requests in order, so older entries will never be answered (acks=0
        produce requests) and are forgotten too.
        """
        if correlation_id not in self._requests:
            return None
        while True:
            key, request = self._requests.popitem(last=False)
            if key == correlation_id:
                return request


def _translate_all(entries: Any, id_field: str, translate: Translate) -> None:
    for entry in entries or ():
        node_id = int(getattr(entry, id_field))
        if node_id >= 0 and entry.host and entry.port >= 0:
            entry.host, entry.port = translate(node_id, str(entry.host), int(entry.port))


def _rewrite_addresses(api_key: int, version: int, payload: bytes, translate: Translate) -> bytes:
    response_class = ADDRESS_RESPONSES[api_key]
    if version > response_class.max_version:
        raise WireError(f"{response_class.__name__} v{version} is newer than kafka-python can rewrite "
                        f"(max v{response_class.max_version})")
    response = response_class.decode(payload, version=version, header=True)
    if response_class is MetadataResponse:
        _translate_all(response.brokers, "node_id", translate)
    elif response_class is DescribeClusterResponse:
        if version >= 1 and response.endpoint_type == _DESCRIBE_CLUSTER_CONTROLLERS:
            return payload  # controller endpoints are not proxied
        _translate_all(response.brokers, "broker_id", translate)
    elif version >= 4:
        _translate_all(response.coordinators, "node_id", translate)
    else:
        _translate_all([response], "node_id", translate)
    return _encode(response, version)


def _encode(response: Any, version: int) -> bytes:
    # A decoded message carries its version; passing version= again would make kafka-python try to set it on the
    # response header, which has no api version field.
    if version != response.API_VERSION:
        raise WireError(f"{type(response).__name__} decoded as v{response.API_VERSION}, expected v{version}")
    return bytes(response.encode(header=True))


def _cap_api_versions(version: int, payload: bytes) -> bytes:
    """Lower the advertised max version of the address-carrying APIs to what kafka-python can decode, so a newer
    broker cannot lead a client to a response the proxy would fail to rewrite."""
    if version > ApiVersionsResponse.max_version:
        return payload  # a version this kafka-python cannot read; brokers answer it with an error in v0 anyway
    response = ApiVersionsResponse.decode(payload, version=version, header=True)
    if response.error_code != 0:
        return payload
    changed = False
    for entry in response.api_keys or ():
        response_class = ADDRESS_RESPONSES.get(int(entry.api_key))
        if response_class is not None and entry.max_version > response_class.max_version:
            entry.max_version = response_class.max_version
            changed = True
    return _encode(response, version) if changed else payload


def rewrite_response(request: RequestInfo, payload: bytes, translate: Translate) -> bytes:
    """``payload`` (a response to ``request``) with every advertised broker address passed through ``translate``.

    Responses of other APIs are returned as they are. Raises :class:`WireError` if a response that carries
    addresses cannot be rewritten.
    """
    try:
        if request.api_key in ADDRESS_RESPONSES:
            return _rewrite_addresses(request.api_key, request.api_version, payload, translate)
        if request.api_key == API_VERSIONS_KEY:
            return _cap_api_versions(request.api_version, payload)
    except WireError:
        raise
    except Exception as exc:  # kafka-python raises assorted errors on data it cannot decode
        raise WireError(f"cannot rewrite the response to {request}: {exc!r}") from exc
    return payload
