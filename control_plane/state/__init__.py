"""Persistent state (SQLAlchemy 2, Alembic): models, the repository, API keys, admin users.

Imports nothing of the control plane outside this package.
"""
