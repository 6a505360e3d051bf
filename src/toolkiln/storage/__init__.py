"""SQLAlchemy tables, repositories and Alembic migrations (SQLite and PostgreSQL)."""
