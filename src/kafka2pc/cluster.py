"""A connection pool to one Kafka cluster, to share between producers and controls of one process: the public
handle of the wire layer."""

from __future__ import annotations

from kafka2pc._wire.cluster_client import ClusterClient

__all__ = ["ClusterClient"]
