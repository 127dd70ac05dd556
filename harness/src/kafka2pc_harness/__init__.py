"""kafka2pc's own test harness: what kafka2pc's test suite, benchmarks and examples start besides a Kafka broker.

PostgreSQL (:mod:`postgres`, :mod:`pg_proxy`), HDFS (:mod:`hdfs`), S3, GCS and Azure storage emulators (:mod:`s3`,
:mod:`s3_server`, :mod:`object_stores`, :mod:`services`), a broker with managed Kafka's secured listeners
(:mod:`secured`, with :mod:`certificates` and an :mod:`oidc` server), a fault-injecting Kafka proxy (:mod:`proxy`),
Spark sessions, drivers and a standalone cluster (:mod:`spark`, :mod:`spark_cluster`), a simulated sink job
(:mod:`sink_workload`), a sink that writes nowhere (:mod:`noop_sink`), and pytest fixtures for them
(:mod:`pytest_plugin`).

It is a second distribution built from kafka2pc's repository (``harness/``) and installed beside kafka2pc in its dev
environment; it is not part of the runtime wheel. What users' own tests need (a broker, read_committed verification,
the ``kafka`` fixtures) is :mod:`kafka2pc.testing`, which ships in kafka2pc itself.
"""
