"""How a service process runs: the in-process stack and its supervision (`up`), each service's FastStream app,
health and metrics over HTTP, log lines, outages waited out, the ledger's pruning between transactions, and the
garbage collector's settings."""
