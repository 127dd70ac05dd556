# kafka2pc: `make demo` and `make test` do all set-up on a fresh machine (Python 3.11+, Java 17+, Maven needed).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Apache Kafka broker jars are resolved from Maven Central into this git-ignored folder.
export KAFKA2PC_JARS_DIR := $(CURDIR)/.kafka-jars
PYTEST_ARGS ?=

.PHONY: setup jars s3a-jars postgres mariadb lint docs test test-archives test-object-stores demo bench bench-spark bench-dual-write bench-fleet-sim bench-recovery profile-dual-write chaos soak clean

# --no-cache-dir: the wheels (pyspark alone is ~490 MB installed) are not kept a second time in pip's cache (~440 MB
# here); a CI run once ran out of disk in this step.
$(VENV)/.installed: pyproject.toml harness/pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "kafka2pc needs Python 3.11+; run make PYTHON=python3.11 ...")'
	@command -v java >/dev/null || { echo "java not found: install Java 17+ (Debian: apt-get install openjdk-17-jre-headless)"; exit 1; }
	@command -v mvn >/dev/null || { echo "mvn not found: install Maven (Debian: apt-get install maven)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --no-cache-dir --upgrade pip
	$(VENV)/bin/pip install --quiet --no-cache-dir -e '.[dev]' -e ./harness
	touch $@

setup: $(VENV)/.installed

jars: setup
	$(PY) -m kafka2pc.testing.jars
	$(PY) -m kafka2pc_harness.spark jars

# Hadoop's S3A filesystem for the Spark drivers whose checkpoint is on the tests' S3 server (about 700 MB, once).
s3a-jars: setup
	$(PY) -c 'from kafka2pc_harness.s3 import s3a_jars; print(len(s3a_jars()), "S3A jar(s)")'

# The dual-write tests need a PostgreSQL server's binaries (the tests start and stop it; it runs as nobody).
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || [ -n "$$KAFKA2PC_POSTGRES_DSN" ] || { \
	  echo "installing PostgreSQL's server (Debian: apt-get install postgresql)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; }

# The MariaDB dual-write tests need MariaDB's server binaries (the tests start and stop it in a temporary folder).
mariadb:
	@command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || [ -n "$$KAFKA2PC_MARIADB_URL" ] || { \
	  echo "installing MariaDB's server (Debian: apt-get install mariadb-server)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mariadb-server >/dev/null; }

lint: setup
	$(VENV)/bin/ruff check src harness tests examples benchmarks
	$(VENV)/bin/mypy

# The docs site into site/ (git-ignored): --strict fails on any warning (a broken link or anchor, a page missing from
# the nav, a docstring the API reference cannot render). A few seconds; part of make test, so CI builds it.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# The default suite: unit tests and integration tests against real brokers; long runs are marked slow. Two workers,
# each with its own brokers and Spark cluster, handed the tests longest first (tests/conftest.py).
test: jars s3a-jars postgres mariadb lint docs
	$(PY) -m pytest -m "not slow" -n 2 --dist worksteal --durations=25 $(PYTEST_ARGS)

demo: jars
	$(PY) examples/demo.py

# Throughput of kafka2pc's producer against confluent-kafka and kafka-python on one local broker, and the process's CPU
# per record beside it (the ratio to confluent-kafka for each like-for-like pair).
bench: jars
	$(PY) benchmarks/producer.py

# The kafka2pc Spark sink against Spark's own Kafka sink (rows/s), and the driver's 2PC time per micro-batch.
bench-spark: jars
	$(PY) benchmarks/spark_sink.py $(BENCH_ARGS)

# Dual write against a DB-only transaction and the outbox pattern's write side, on SQLite and PostgreSQL; then a
# leasing fleet on PostgreSQL (1 and 4 processes x DualWriterPool(4)) and leasing's cost against the pool before it
# (commit 4018cfd, extracted by git archive). BENCH_ARGS="--sections fleet" runs only the fleet.
bench-dual-write: jars postgres mariadb
	$(PY) benchmarks/dual_write.py $(BENCH_ARGS)

# Where a dual write's CPU goes: 3000 dual writes over 8 threads on PostgreSQL, CPU per transaction, and py-spy's
# profile of the GIL-held time after the warm-up (docs/performance.md).
profile-dual-write: jars postgres
	$(PY) benchmarks/profile_dual_write.py --py-spy profile-dual-write.txt $(BENCH_ARGS)

# 1000 simulated DualWriterPools (leases only, no Kafka) on one PostgreSQL server: lease operations/s, query latency,
# the server's CPU, and how fast live pools take over the ids of 100 that die midway (about 90 s).
bench-fleet-sim: setup postgres
	$(PY) benchmarks/lease_simulation.py $(BENCH_ARGS)

# Sink recovery time after crashed restarts, and transactional ids held with POOLING vs INCREMENTING.
bench-recovery: jars
	$(PY) benchmarks/recovery.py

# Long chaos runs, by their own target (not part of `make test`): 50 000 model-based sequences, and the Spark main
# job's driver SIGKILLed 30 times (2 in the default suite, the first ones aimed inside a transaction), and the
# foreachBatch job's 12 times (2 in the default suite; every other kill right after a save() returned), and the main
# job with its checkpoint on HDFS 5 times (the default suite kills it once, after a NameNode outage), and the main job through 5 storage outages
# around its commits with its checkpoint on HDFS and 5 on S3 (the default suite: one on HDFS, none on S3); and the
# main job through an in-place upgrade of its broker from 3.9.2 to 4.4.0 with two-phase commit on (about 5 min; the
# default suite turns two-phase commit on and off under the sink's writer on 4.4.0); and the Spark streaming job and
# keyed Spark batch writes through a rolling restart of the 3-node cluster and a SIGKILL of its busiest coordinator
# (about 3 and 2 min; the default suite puts a DualWriterPool under load through the same events); and the Spark
# streaming job with a DualWriterPool through a rolling upgrade of the 3-node cluster from 3.9.2 to 4.4.0, then
# two-phase commit turned on node by node, then transaction.version 2 (about 8 min).
# The harness's own tests of process clean-up, node restarts and kept logs are marked slow and run here too.
chaos: jars s3a-jars
	KAFKA2PC_MODEL_EXAMPLES=50000 $(PY) -m pytest -m "slow or model" -p no:logging $(PYTEST_ARGS)
	KAFKA2PC_SPARK_KILLS=30 $(PY) -m pytest -p no:logging tests/integration/test_spark_kills.py $(PYTEST_ARGS)
	KAFKA2PC_FOREACH_BATCH_KILLS=12 $(PY) -m pytest -p no:logging tests/integration/test_spark_foreach_batch.py $(PYTEST_ARGS)
	KAFKA2PC_HDFS_DRIVER_KILLS=5 $(PY) -m pytest -p no:logging tests/integration/test_remote_checkpoints.py -k driver_kills $(PYTEST_ARGS)
	KAFKA2PC_STORAGE_OUTAGES=5 $(PY) -m pytest -p no:logging tests/integration/test_storage_outages.py $(PYTEST_ARGS)
	KAFKA2PC_FLEET_LEASE_S=15 $(PY) -m pytest -p no:logging tests/integration/test_dual_write_fleet.py $(PYTEST_ARGS)
	KAFKA2PC_UPGRADE_SPARK=1 $(PY) -m pytest -p no:logging tests/integration/test_broker_gains_2pc.py -k spark $(PYTEST_ARGS)
	KAFKA2PC_ROLLING_SPARK=1 $(PY) -m pytest -p no:logging tests/integration/test_rolling_restart.py -k spark $(PYTEST_ARGS)
	KAFKA2PC_ROLLING_UPGRADE=1 $(PY) -m pytest -p no:logging tests/integration/test_rolling_upgrade.py $(PYTEST_ARGS)

# The soak (issue 32): for KAFKA2PC_SOAK_MINUTES (30 here), the Spark streaming job fed without a pause, a dual-write
# fleet of 3 processes on PostgreSQL, and a random event on the 3-node cluster every 45-90 s (a node SIGTERMed,
# SIGKILLed or SIGSTOPped); it prints records, duplicates, gaps, pinned time, errors by group, RSS and open fds.
soak: jars postgres
	KAFKA2PC_SOAK_MINUTES=$${KAFKA2PC_SOAK_MINUTES:-30} $(PY) -m pytest -p no:logging -s tests/integration/test_soak.py $(PYTEST_ARGS)

# kafka2pc shipped to a standalone cluster's executors in a venv-pack'ed environment (spark.archives): it builds and
# packs an environment, so it is not part of `make test`.
test-archives: jars
	$(PY) -m pytest -p no:logging -s tests/integration/test_spark_archives.py $(PYTEST_ARGS)

# Decision logs on Google Cloud Storage and Azure storage, against fake-gcs-server (go install) and Azurite
# (npm install): the default suite covers S3 (moto) and HDFS (Hadoop's mini cluster); these need Go and Node.js.
test-object-stores: $(VENV)/.installed
	$(PY) -m pytest -p no:logging -m slow tests/integration/test_remote_checkpoints.py $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .kafka-jars .pytest_cache .mypy_cache .ruff_cache
