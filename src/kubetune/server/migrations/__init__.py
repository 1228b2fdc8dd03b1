"""The server's Alembic migration environment (``env.py``, ``versions/``): applied by
:func:`kubetune.server.store.migrate` at every server start, never by hand."""
