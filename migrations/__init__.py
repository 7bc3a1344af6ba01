"""Alembic environment and versions: the only source of truth for the database schema."""
