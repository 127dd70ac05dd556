"""What a Kafka cluster supports for two-phase commit, found by asking it (never by guessing from a version)."""

from __future__ import annotations

from typing import Any

import attrs
from kafka.protocol.admin.transactions import DescribeTransactionsRequest, ListTransactionsRequest
from kafka.protocol.producer.transaction import EndTxnRequest, InitProducerIdRequest

from kafka2pc._core import codes
from kafka2pc._core.versions import INIT_PRODUCER_ID_2PC_VERSION, LIST_TRANSACTIONS_PATTERN_VERSION
from kafka2pc._wire.cluster_client import ClusterClient
from kafka2pc.transaction_control import TransactionControl

DEFAULT_PROBE_TRANSACTIONAL_ID = "kafka2pc-doctor-probe"


@attrs.frozen
class BrokerCapabilities:
    """The facts about a cluster that decide how kafka2pc runs two-phase commit on it."""

    bootstrap_servers: str
    init_producer_id_max_version: int
    end_txn_max_version: int
    list_transactions_max_version: int
    describe_transactions_max_version: int
    enable_2pc: bool
    enable_2pc_detail: str
    keep_prepared_txn: bool
    keep_prepared_txn_detail: str
    transaction_version: int
    transaction_max_timeout_ms: int | None
    two_phase_commit_broker_config: str | None

    @property
    def list_transactions_pattern_filter(self) -> bool:
        """Whether ListTransactions can filter by transactional-id pattern on the broker."""
        return self.list_transactions_max_version >= LIST_TRANSACTIONS_PATTERN_VERSION

    def to_json_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field plus the derived ones."""
        data = attrs.asdict(self)
        data["list_transactions_pattern_filter"] = self.list_transactions_pattern_filter
        return data


def probe_capabilities(
    client: ClusterClient, *, probe_transactional_id: str = DEFAULT_PROBE_TRANSACTIONAL_ID
) -> BrokerCapabilities:
    """Ask the cluster what it supports.

    Sends InitProducerId with Enable2Pc (and then with KeepPreparedTxn) for ``probe_transactional_id``, which
    must not be used by any application: the probe bumps its producer epoch, and the broker keeps its metadata
    for ``transactional.id.expiration.ms``.
    """
    init_max = client.broker_max_version(InitProducerIdRequest)
    configs = client.broker_configs(["transaction.max.timeout.ms", "transaction.two.phase.commit.enable"])
    max_timeout = configs["transaction.max.timeout.ms"]

    if init_max < INIT_PRODUCER_ID_2PC_VERSION:
        missing = (f"broker advertises InitProducerId up to v{init_max}; Enable2Pc needs "
                   f"v{INIT_PRODUCER_ID_2PC_VERSION} (Apache Kafka >= 4.1 with "
                   "transaction.two.phase.commit.enable=true and unstable.api.versions.enable=true)")
        enable_2pc, enable_detail = False, missing
        keep, keep_detail = False, missing
    else:
        control = TransactionControl(client)
        enable_2pc, enable_detail = _try_init(control, probe_transactional_id, enable_2pc=True, keep_prepared=False)
        if not enable_2pc and configs["transaction.two.phase.commit.enable"] == "false":
            # The broker answers TRANSACTIONAL_ID_AUTHORIZATION_FAILED both for a missing ACL and for 2PC disabled.
            enable_detail += "; the broker has transaction.two.phase.commit.enable=false"
        keep, keep_detail = _try_init(control, probe_transactional_id, enable_2pc=enable_2pc, keep_prepared=True)

    return BrokerCapabilities(
        bootstrap_servers=client.bootstrap_servers,
        init_producer_id_max_version=init_max,
        end_txn_max_version=client.broker_max_version(EndTxnRequest),
        list_transactions_max_version=client.broker_max_version(ListTransactionsRequest),
        describe_transactions_max_version=client.broker_max_version(DescribeTransactionsRequest),
        enable_2pc=enable_2pc,
        enable_2pc_detail=enable_detail,
        keep_prepared_txn=keep,
        keep_prepared_txn_detail=keep_detail,
        transaction_version=client.finalized_feature_level("transaction.version"),
        transaction_max_timeout_ms=int(max_timeout) if max_timeout is not None else None,
        two_phase_commit_broker_config=configs["transaction.two.phase.commit.enable"],
    )


_HINTS = {
    codes.Kind.UNAUTHORIZED: "the principal lacks WRITE or TWO_PHASE_COMMIT on the transactional id",
    codes.Kind.UNSUPPORTED: "the coordinator does not implement this request",
    codes.Kind.STALE: "the broker refused; transaction.two.phase.commit.enable may be off",
}


def _try_init(
    control: TransactionControl, transactional_id: str, *, enable_2pc: bool, keep_prepared: bool
) -> tuple[bool, str]:
    answer = control.probe_init(transactional_id, enable_2pc=enable_2pc, keep_prepared=keep_prepared)
    kind = codes.kind(answer.error)
    if kind is codes.Kind.DONE and answer.identity is not None:
        return True, f"accepted (producer id {answer.identity.producer_id}, epoch {answer.identity.epoch})"
    name = codes.error_name(answer.error)
    hint = _HINTS.get(kind)
    return False, f"refused: {name}" + (f" ({hint})" if hint else "")
