"""Alembic migrations of autoopt's own tables (version table `autoopt_alembic_version`).

Run programmatically by autoopt.store.db.migrate on every Store.open. To write a new revision:
    alembic -c autoopt/store/migrations/alembic.ini revision -m "what changes"
(then edit it by hand; batch ops, so SQLite can alter tables).
"""
