"""Storage: the database backends (SQLite, PostgreSQL), the response store and the usage ledger."""
