"""``kubetune server``: the jobs service teams run. OpenAI's fine-tuning API (files, fine_tuning.jobs, events,
checkpoints) over a database (SQLite or PostgreSQL, Alembic migrations), API keys naming projects, and a runner
that submits jobs to a backend exactly as ``kubetune run`` does and copies their progress into the database.

Modules: ``config`` (settings), ``models`` and ``migrations/`` (the schema), ``store`` (the records),
``auth`` (keys, rate limit), ``files`` (upload checks), ``objects`` (OpenAI's shapes, request -> spec),
``runner`` (submit, follow, cancel, pause), ``chat`` (chat completions with fine-tuned models), ``app`` (routes).
Nothing here is imported by ``import kubetune``: the CLI imports it inside ``kubetune server``.
"""
