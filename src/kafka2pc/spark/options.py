"""The options of the ``kafka2pc`` Spark data source: Spark's Kafka sink's names, plus the 2PC ones, validated on the
driver before anything is written. Spark passes option keys lower-cased."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any
from urllib.parse import urlparse

import attrs

from kafka2pc.config import ProducerConfig, keys
from kafka2pc.config.keys import redacted_repr
from kafka2pc.config.redaction import Secret
from kafka2pc.errors import ConfigError
from kafka2pc.sink.naming import TransactionalIdGrammar, TransactionNamingStrategy
from kafka2pc.sink.producer_cache import DEFAULT_IDLE_TIMEOUT_S
from kafka2pc.sink.storage import hadoop_setting, open_folder
from kafka2pc.sink.write_keys import WriteKey

KAFKA_PREFIX = "kafka."
#: options Spark's Kafka sink has, or kafka2pc adds (lower-cased, as Spark passes them)
SINK_OPTIONS = frozenset({"topic", "checkpointlocation", "transactionalidprefix", "transactionnamingstrategy",
                          "twophasecommit", "includeheaders", "txnappid", "txnversion",
                          "producercachetimeout"})
#: producer settings kafka2pc chooses itself: the sink names its transactional ids
_RESERVED = frozenset({"transactional.id"})
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")
#: Spark's time units (JavaUtils.timeStringAs), in seconds
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"\s*([0-9]+)\s*([a-z]*)\s*")
#: Spark's Kafka sink's names for what this sink's option producerCacheTimeout sets
_SPARK_CACHE_TIMEOUT = frozenset({"spark.kafka.producer.cache.timeout", "kafka.producer.cache.timeout"})


def _duration_s(key: str, value: str) -> float:
    """A Spark duration (``10m``, ``30s``, ``500ms``; a bare number is milliseconds, as Spark's
    ``spark.kafka.producer.cache.timeout`` takes it), in seconds."""
    match = _DURATION.fullmatch(value.lower())
    if match is None or match.group(2) not in (*_UNITS, ""):
        raise ConfigError(key, f"expected a duration such as 10m, 30s or 500ms (a bare number is milliseconds; 0 "
                               f"keeps no producers), got {value!r}")
    return int(match.group(1)) * _UNITS.get(match.group(2), 1e-3)


def _bool(key: str, value: str) -> bool:
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(key, f"expected true or false, got {value!r}")


def default_filesystem(environment: Mapping[str, str]) -> str | None:
    """Where Spark resolves a scheme-less path, as far as the driver's environment tells: ``dbfs:`` on Databricks,
    else ``fs.defaultFS`` of the Hadoop configuration in ``HADOOP_CONF_DIR``/``YARN_CONF_DIR`` (None: not set)."""
    if environment.get("DATABRICKS_RUNTIME_VERSION"):
        return "dbfs:/"
    return hadoop_setting("fs.defaultFS", environment)


def checkpoint_location(key: str, location: str, environment: Mapping[str, str] | None = None) -> str:
    """A checkpoint location kafka2pc can keep its decisions in: a local path (made absolute), a ``file:`` URI, or
    an ``s3://``/``s3a://`` URL (see :func:`kafka2pc.sink.storage.open_folder`); other schemes are refused, and so is
    a scheme-less path that Spark would resolve against a non-local default filesystem (kafka2pc would write
    elsewhere than Spark's checkpoint)."""
    if not urlparse(location).scheme:
        default = default_filesystem(os.environ if environment is None else environment)
        if default is not None and urlparse(default).scheme not in ("", "file"):
            raise ConfigError(key, f"{location!r} has no scheme, and Spark resolves it against {default} (the "
                                   "default filesystem here), not the local disk kafka2pc would write to: give the "
                                   "full URI (s3a://bucket/path, or file:///path for a local folder; on Databricks "
                                   "a /dbfs/... path is local to the driver)")
    return open_folder(location, key=key).location


def _write_key(opts: Mapping[str, str], *, streaming: bool) -> WriteKey | None:
    app_id, version = opts.get("txnappid"), opts.get("txnversion")
    if app_id is None and version is None:
        return None
    if streaming:
        raise ConfigError("txnAppId", "is for batch writes, typically in foreachBatch; a streaming query's batches "
                                      "are written once each already (by their batch id)")
    if app_id is None or version is None:
        missing = "txnVersion" if version is None else "txnAppId"
        raise ConfigError(missing, "is required with the other one: txnAppId (a stable id of the writing application) "
                                   "and txnVersion (increasing, typically foreachBatch's batch_id) go together")
    try:
        number = int(version.strip())
    except ValueError:
        raise ConfigError("txnVersion", f"must be an integer >= 0, got {version!r}") from None
    return WriteKey(app_id, number)


def _frozen(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping))


@attrs.frozen
class SinkOptions:
    """Validated options. ``producer_config`` holds the ``kafka.*`` settings with the prefix stripped (Kafka's dotted
    names), ready for :class:`~kafka2pc.TwoPhaseProducer`."""

    producer_config: Mapping[str, Any] = attrs.field(converter=_frozen, repr=redacted_repr)
    checkpoint_location: str
    topic: str | None = None
    prefix: str | None = None
    naming: TransactionNamingStrategy = TransactionNamingStrategy.POOLING
    two_phase_commit: bool = True
    #: a batch write's idempotent-write key (options ``txnAppId`` and ``txnVersion``), None when not given
    write_key: WriteKey | None = None
    #: option ``producerCacheTimeout``: how long an executor's Python worker keeps an unused producer
    producer_cache_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S

    @classmethod
    def from_options(cls, options: Mapping[str, str], *, streaming: bool) -> SinkOptions:
        """Validate Spark's options; a ConfigError names the first bad or unknown one."""
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        spelled = {str(k).lower(): str(k) for k in options}  # Spark hands options over lower-cased, or not
        if opts.get("asyncprogresstrackingenabled", "false").strip().lower() in _TRUE:
            raise ConfigError("asyncProgressTrackingEnabled", "exactly-once needs the offsets written before the batch "
                                                              "runs; async progress tracking writes them after it")
        opts.pop("asyncprogresstrackingenabled", None)
        producer: dict[str, Any] = {}
        for key, value in opts.items():
            if key in _SPARK_CACHE_TIMEOUT:
                raise ConfigError(spelled[key], "is Spark's Kafka sink's setting; this sink's is the option "
                                                "producerCacheTimeout")
            if key.startswith(KAFKA_PREFIX):
                name = key[len(KAFKA_PREFIX):]
                if name in _RESERVED:
                    raise ConfigError(spelled[key], "is chosen by the sink (see transactionalIdPrefix)")
                producer[name] = Secret(value) if keys.is_secret(name) else value
            elif key not in SINK_OPTIONS:
                raise ConfigError(spelled[key], "unknown option of the kafka2pc sink (Kafka client settings take the "
                                       "'kafka.' prefix, e.g. kafka.bootstrap.servers)")
        if "bootstrap.servers" not in producer and "metadata.broker.list" not in producer:
            raise ConfigError("kafka.bootstrap.servers", "is required")
        # the producer's own validation names a bad key (with the Spark prefix restored below)
        try:
            ProducerConfig.from_dict({**producer, "transactional.id": "x"}, two_phase_commit=True)
        except ConfigError as exc:
            problem = str(exc).split(": ", 1)[-1].replace("did you mean '", f"did you mean '{KAFKA_PREFIX}")
            raise ConfigError(KAFKA_PREFIX + exc.key, problem) from exc
        location = opts.get("checkpointlocation")
        if not location:
            what = "the query" if streaming else "the write"
            raise ConfigError("checkpointLocation", f"is required: {what}'s decisions are recorded there (pass it "
                                                    "with .option('checkpointLocation', ...); a location derived "
                                                    "from spark.sql.streaming.checkpointLocation is not passed to "
                                                    "sinks)")
        prefix = opts.get("transactionalidprefix")
        if prefix is not None:
            TransactionalIdGrammar(prefix)
        naming_text = opts.get("transactionnamingstrategy", "pooling").strip().lower()
        try:
            naming = TransactionNamingStrategy(naming_text)
        except ValueError:
            raise ConfigError("transactionNamingStrategy", f"expected pooling or incrementing, got "
                                                           f"{naming_text!r}") from None
        return cls(producer_config=producer, checkpoint_location=checkpoint_location("checkpointLocation", location),
                   topic=opts.get("topic") or None, prefix=prefix, naming=naming,
                   two_phase_commit=_bool("twoPhaseCommit", opts.get("twophasecommit", "true")),
                   write_key=_write_key(opts, streaming=streaming),
                   producer_cache_timeout_s=_duration_s("producerCacheTimeout",
                                                        opts.get("producercachetimeout", "10m")))

