"""Alembic's environment: migrations run on the connection :func:`kubetune.server.store.migrate` hands over
(``config.attributes["connection"]``); there is no alembic.ini and no offline mode."""

from __future__ import annotations

from alembic import context

from kubetune.server.models import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
