pytest_plugins = ["kafka2pc.testing.pytest_plugin", "pytester"]
