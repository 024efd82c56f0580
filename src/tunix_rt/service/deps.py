"""Annotated dependencies shared by the routers: settings, and the one rule for ids, page
sizes and offsets (validated here, so a route never hands SQL a negative or 64-bit-overflowing
number). No `from __future__ import annotations` here: FastAPI reads the
annotations of the functions built below, which name their closure's values."""

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Path, Query, Request

from tunix_rt.service.settings import Settings

SQL_INT_MAX = 2**63 - 1
"""The largest integer SQLite and PostgreSQL bind (BIGINT); past it a query overflows."""


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


SettingsDep = Annotated[Settings, Depends(get_settings)]
JobId = Annotated[int, Path(ge=1, le=SQL_INT_MAX, description="A job id.")]
Position = Annotated[int, Query(ge=0, le=SQL_INT_MAX)]
"""A row offset or a log position."""


@dataclass(frozen=True)
class Page:
    limit: int
    offset: int


def limited(default: int, cap: int):
    """A `limit` query as a route parameter: non-negative (422 otherwise), and a limit past
    the route's cap is clamped to it, as the API documents."""

    def limit(limit: Annotated[int, Query(ge=0, description=f"Rows to return (at most {cap}; more is clamped).")] = default) -> int:
        return min(limit, cap)

    return Annotated[int, Depends(limit)]


def paged(default: int, cap: int):
    """`limit` (as `limited`) and a non-negative `offset`, as one route parameter."""

    def page(limit: limited(default, cap), offset: Position = 0) -> Page:
        return Page(limit, offset)

    return Annotated[Page, Depends(page)]
