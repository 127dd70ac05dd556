from kafka2pc.testing import PRE_2PC_KAFKA_VERSION, BrokerSettings


def test_two_phase_commit_on_sets_what_init_producer_id_v6_needs():
    props = BrokerSettings(version="4.4.0").server_properties(1)
    assert props["transaction.two.phase.commit.enable"] == "true"
    assert props["unstable.api.versions.enable"] == "true"
    assert props["transaction.state.log.replication.factor"] == "1"
    assert props["transaction.state.log.min.isr"] == "1"


def test_two_phase_commit_off_is_explicit():
    props = BrokerSettings(version="4.4.0", two_phase_commit=False).server_properties(1)
    assert props["transaction.two.phase.commit.enable"] == "false"
    assert "unstable.api.versions.enable" not in props


def test_pre_2pc_release_gets_no_unknown_configs():
    props = BrokerSettings(version=PRE_2PC_KAFKA_VERSION).server_properties(1)
    assert "transaction.two.phase.commit.enable" not in props
    assert "unstable.api.versions.enable" not in props


def test_three_nodes_replicate_the_transaction_log_with_min_isr_two():
    props = BrokerSettings().server_properties(3)
    assert props["transaction.state.log.replication.factor"] == "3"
    assert props["transaction.state.log.min.isr"] == "2"
    assert props["min.insync.replicas"] == "2"


def test_extra_and_timeout_override_defaults():
    settings = BrokerSettings(transaction_max_timeout_ms=10_000, extra={"num.partitions": 3})
    props = settings.server_properties(1)
    assert props["transaction.max.timeout.ms"] == "10000"
    assert props["num.partitions"] == "3"


def test_cluster_ids_never_look_like_options():
    from kafka2pc.testing.local import new_cluster_id  # noqa: PLC0415

    ids = [new_cluster_id() for _ in range(5000)]  # ~1 in 64 raw candidates starts with '-'
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)
    assert len(set(ids)) == len(ids)
