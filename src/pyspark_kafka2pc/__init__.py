"""Spark registers installed ``pyspark_*`` modules' ``DefaultSource`` at startup: ``format("kafka2pc")`` then works
with no registration call."""

from kafka2pc.spark.source import Kafka2pcDataSource as DefaultSource

__all__ = ["DefaultSource"]
