"""Review 32c, finding 2: an EndTxn the client refuses to send is UnsupportedByBrokerError (a FatalError) only when
the versions it holds were read from every broker lately. When their re-read failed (a broker restarting) the
refusal says nothing about the cluster: the end is not sent and is tried again (in the end retriable), so a decided
commit is never made fatal by a short outage."""

from __future__ import annotations

import kafka.errors as kafka_errors

from kafka2pc.errors import FatalError, TransactionNotSettledError

from .test_review32b_pinned_end import MixedClient, commit_prepared_v2


class MixedClientMidRestart(MixedClient):
    """The same mixed cluster, with broker 3 not answering ApiVersions (restarting): the re-read fails."""

    def send_idempotent(self, factory, node_id, *, what, timeout_s):
        if node_id == 3:
            raise kafka_errors.KafkaConnectionError("broker 3 is restarting")
        return super().send_idempotent(factory, node_id, what=what, timeout_s=timeout_s)


def test_a_decided_commit_refused_on_versions_that_could_not_be_read_again_is_retriable_not_fatal():
    client = MixedClientMidRestart()
    result = commit_prepared_v2(client)
    assert client.end_versions == []  # nothing sent, no v4 either
    assert isinstance(result, TransactionNotSettledError), result
    assert not isinstance(result, FatalError)
