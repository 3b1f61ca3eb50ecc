"""The Alembic revisions: the only source of the schema (``amptrain db upgrade``)."""
