"""Errors of the test harness."""

from __future__ import annotations

from kafka2pc.errors import FatalError, UsageError


class HarnessSetupError(FatalError):
    """A broker could not be provided: a missing tool, a failed download, a node that did not start."""


class NodeControlUnsupported(UsageError):
    """The selected Kafka (an existing cluster, a container) cannot stop, kill or restart single nodes."""
