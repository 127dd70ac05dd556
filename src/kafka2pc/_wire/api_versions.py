"""The brokers' ApiVersions read again while a client runs, and put to use.

kafka-python reads ApiVersions when it connects, then gives every later connection the versions it learnt first
and keeps them: a broker that restarts with more (an in-place upgrade, ``unstable.api.versions.enable`` or
``transaction.two.phase.commit.enable`` turned on) is "clamped" to the old ones, connection after connection. A
running client would never see InitProducerId v6 arrive, and could not send it either. :func:`read_again` asks
every broker and makes the client's connections, old and new, use what all of them speak. Whether to read them
again is decided by the core (:func:`kafka2pc._core.initialization.versions_too_old`), from :func:`age_s`.

Like :mod:`kafka2pc._wire.cluster_client`, this touches kafka-python's connection internals (pinned in pyproject).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Mapping, Sequence

from kafka.protocol.broker_version_data import BrokerVersionData
from kafka.protocol.metadata import ApiVersionsRequest

from kafka2pc._core import codes
from kafka2pc._wire.cluster_client import ClusterClient
from kafka2pc._wire.retrying import TRANSIENT
from kafka2pc.errors import Kafka2pcError

log = logging.getLogger(__name__)

Ranges = Mapping[int, tuple[int, int]]
#: when each client last read every broker's ApiVersions (monotonic clock)
_READ_AT: weakref.WeakKeyDictionary[ClusterClient, float] = weakref.WeakKeyDictionary()
#: when a read of them last failed (a broker did not answer): not tried again sooner than the age that asks for one
_FAILED_AT: weakref.WeakKeyDictionary[ClusterClient, float] = weakref.WeakKeyDictionary()
_RETRY_FAILED_S = 10.0


def age_s(client: ClusterClient) -> float | None:
    """How long ago :func:`read_again` last read ``client``'s brokers; None if it never did (the client has the
    versions it learnt when it connected, however old)."""
    read_at = _READ_AT.get(client)
    return None if read_at is None else time.monotonic() - read_at


def common_ranges(per_broker: Sequence[Ranges]) -> dict[int, tuple[int, int]]:
    """The (min, max) version of each API that every broker speaks: a request built from it is understood by
    whichever broker coordinates it, also after a coordinator moves."""
    if not per_broker:
        return {}
    keys = set(per_broker[0]).intersection(*per_broker[1:])
    common = {}
    for key in keys:
        low = max(ranges[key][0] for ranges in per_broker)
        high = min(ranges[key][1] for ranges in per_broker)
        if low <= high:
            common[key] = (low, high)
    return common


def read_again(client: ClusterClient, *, timeout_s: float) -> bool:
    """Read the ApiVersions of every broker the client knows; when all answered, make the client use the versions
    they all speak (its connections, the spread lanes, and connections it opens later) and note the time. False,
    changing nothing, when a broker did not answer within ``timeout_s``."""
    failed_at = _FAILED_AT.get(client)
    if failed_at is not None and time.monotonic() - failed_at < _RETRY_FAILED_S:
        return False
    per_broker = []
    for broker in client.broker_ids():
        try:
            response = client.send_idempotent(lambda: ApiVersionsRequest(
                client_software_name="kafka2pc", client_software_version="0"), broker, what="ApiVersions",
                timeout_s=timeout_s)
        except (Kafka2pcError, *TRANSIENT) as exc:
            log.info("could not read the ApiVersions of broker %s again (%r): the known ones stay in use", broker, exc)
            _FAILED_AT[client] = time.monotonic()
            return False
        if codes.kind(response.error_code) is not codes.Kind.DONE:
            log.info("broker %s answered ApiVersions with %s: the known versions stay in use", broker,
                     codes.error_name(response.error_code))
            return False
        per_broker.append({int(api.api_key): (int(api.min_version), int(api.max_version))
                           for api in response.api_keys})
    if not per_broker:
        return False
    _adopt(client, common_ranges(per_broker))
    _READ_AT[client] = time.monotonic()
    return True


def _adopt(client: ClusterClient, ranges: Ranges) -> None:
    """Put ``ranges`` in the place of every version kafka-python keeps for the client (on its IO thread)."""
    manager = client._manager
    lanes = client._lanes
    fresh = BrokerVersionData(api_versions=dict(ranges))

    async def adopt() -> None:
        before = manager.broker_version_data
        manager.broker_version_data = fresh  # what connections made from now on start from
        for conn in [*manager._conns.values(), *lanes._lanes.values()]:
            conn.broker_version_data = fresh
        if before is None or before.api_versions != fresh.api_versions:
            log.info("the brokers' ApiVersions changed: now using %s", fresh)

    manager.run(adopt)
