"""The durable record of a sweep: the SQLite ledger (store) and the one-runner lock."""
