"""Private: the wire. Everything that touches kafka-python's networking: the cluster client and its connection
lanes, the cluster-wide listing, and the transport that carries the core's commands and the data plane's Produce
calls to real brokers."""
