"""The registry: one database (SQLite in the home, or PostgreSQL via DATABASE_URL) that indexes
datasets, model versions, runs, evaluations and jobs. Files on disk stay the source of truth;
rows point at them and can be rebuilt with `tunix-rt registry sync`."""
