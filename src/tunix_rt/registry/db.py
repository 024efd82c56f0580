"""Engine, sessions and migrations.

SQLite (the default, `<home>/registry.db`) runs in WAL mode with a busy timeout, and every
transaction starts with BEGIN IMMEDIATE: a transaction that would read then write can never
deadlock on the lock upgrade, and the job claim is atomic. PostgreSQL (DATABASE_URL) uses
its own row locks. Migrations run once per database even when many processes start at the
same moment: under a PostgreSQL advisory lock, or an exclusive file lock beside the SQLite file.
"""

from __future__ import annotations

import contextlib
import fcntl
import threading
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.orm import Session, sessionmaker

from tunix_rt.home import Home

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
ADVISORY_LOCK_KEY = 0x7475_6E69_7872  # "tunixr": one key for every tunix-rt database
_engines: dict[str, Engine] = {}
_migrated: set[str] = set()
_lock = threading.Lock()


def normalize_url(url: str) -> str:
    """postgresql:// and postgres:// mean psycopg 3 here (the only driver we ship)."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def make_engine(url: str) -> Engine:
    """A new engine for `url`, with the SQLite settings this module's docstring describes."""
    url = normalize_url(url)
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})
        sqlite_immediate(engine)
        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=5)


def sqlite_immediate(engine: Engine) -> None:
    """WAL, a busy timeout and BEGIN IMMEDIATE on every connection `engine` opens from now
    on (also applied to Optuna's engine on the same file: tunix_rt.sweep.study)."""

    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn, _record) -> None:
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def get_engine(url: str | None = None) -> Engine:
    """The process-wide engine for `url` (default: the home's), migrated on first use."""
    url = normalize_url(url or Home.resolve().database_url)
    with _lock:
        engine = _engines.get(url)
        if engine is None:
            if url.startswith("sqlite:///"):
                Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
            engine = _engines[url] = make_engine(url)
        if url not in _migrated:
            migrate(engine)
            _migrated.add(url)
    return engine


def dispose_all() -> None:
    """Forget every cached engine (tests switch databases; a forked worker must reconnect)."""
    with _lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()
        _migrated.clear()


@contextlib.contextmanager
def session(url: str | None = None) -> Iterator[Session]:
    """One transaction: committed on success, rolled back on error."""
    maker = sessionmaker(get_engine(url), expire_on_commit=False)
    with maker.begin() as s:
        yield s


def alembic_config(connection) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = connection
    return cfg


def registry_tables_only(name: str | None, type_: str, _parents: dict) -> bool:
    """Alembic's filter: a migration compares and changes our tables only. Optuna's tables
    (tunix_rt.sweep) share the database and are Optuna's to manage."""
    from tunix_rt.registry.models import Base

    return type_ != "table" or name in Base.metadata.tables


def migrate(engine: Engine) -> None:
    """Upgrade to head, once, whoever else is starting at the same time."""
    with exclusive(engine) as conn:
        with conn.begin():
            command.upgrade(alembic_config(conn), "head")


@contextlib.contextmanager
def exclusive(engine: Engine) -> Iterator[Connection]:
    """A connection holding the database-wide schema lock (a PostgreSQL advisory lock, or an
    exclusive file lock beside the SQLite file): schema changes happen under it, one process
    at a time (our migrations; Optuna's tables, tunix_rt.sweep.study)."""
    if engine.dialect.name != "postgresql":
        with _file_lock(engine), engine.connect() as conn:
            yield conn
        return
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": ADVISORY_LOCK_KEY})
        try:
            conn.commit()
            yield conn
        finally:
            conn.rollback()
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": ADVISORY_LOCK_KEY})
            conn.commit()


@contextlib.contextmanager
def _file_lock(engine: Engine) -> Iterator[None]:
    """An exclusive flock on `<db>.migrate.lock`; in-memory databases need none."""
    db = engine.url.database
    if not db or db == ":memory:":
        yield
        return
    with open(f"{db}.migrate.lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
