"""Where everything lives: TUNIX_RT_HOME (default ~/.tunix-rt), overridden by --home."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Home:
    """The home directory and the fixed layout inside it (DESIGN.md §2)."""

    root: Path

    @classmethod
    def resolve(cls, override: str | os.PathLike | None = None) -> "Home":
        raw = override or os.environ.get("TUNIX_RT_HOME") or Path.home() / ".tunix-rt"
        return cls(Path(raw).expanduser().resolve())

    @property
    def models(self) -> Path:
        return self.root / "models"

    @property
    def datasets(self) -> Path:
        return self.root / "datasets"

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    @property
    def registry_db(self) -> Path:
        return self.root / "registry.db"

    @property
    def database_url(self) -> str:
        """DATABASE_URL selects PostgreSQL; SQLite in the home otherwise."""
        return os.environ.get("DATABASE_URL") or f"sqlite:///{self.registry_db}"

    def ensure(self) -> "Home":
        for p in (self.root, self.models, self.datasets, self.runs):
            p.mkdir(parents=True, exist_ok=True)
        return self
