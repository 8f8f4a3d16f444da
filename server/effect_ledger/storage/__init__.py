"""Storage: SQLAlchemy 2 Core over PostgreSQL (psycopg 3) or SQLite (the embedded default)."""
