pytest_plugins = ["kafka2pc.testing.pytest_plugin", "kafka2pc.testing.spark_fixtures", "pytester"]
