"""Alembic environment: always run programmatically by tunix_rt.registry.db.migrate(), which
passes an open connection in config.attributes (no alembic.ini, no URL in files)."""

from alembic import context

from tunix_rt.registry.db import registry_tables_only
from tunix_rt.registry.models import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True,
                  include_name=registry_tables_only)
with context.begin_transaction():
    context.run_migrations()
