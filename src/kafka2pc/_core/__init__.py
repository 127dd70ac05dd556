"""Private: the sans-IO core. Machines that decide (producer control plane, completion, recovery's requests),
the commands and answers they exchange with a transport, the one driver, retry policy and error-code
classification. Imports nothing above it (see docs/design.md)."""
