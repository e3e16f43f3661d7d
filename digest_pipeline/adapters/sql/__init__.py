"""The SQL ledger over SQLite and PostgreSQL: engine, schema, migrations, rows, invariants."""
