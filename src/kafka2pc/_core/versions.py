"""Protocol versions that gate what kafka2pc can ask of a broker."""

from __future__ import annotations

#: InitProducerId carries Enable2Pc and KeepPreparedTxn from this version on (KIP-939).
INIT_PRODUCER_ID_2PC_VERSION = 6
#: ListTransactions filters by transactional-id pattern from this version on (KIP-1152).
LIST_TRANSACTIONS_PATTERN_VERSION = 2
#: ListTransactions filters by duration from this version on (KIP-994).
LIST_TRANSACTIONS_DURATION_VERSION = 1
