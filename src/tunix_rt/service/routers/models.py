"""Models and their content-addressed versions."""

from __future__ import annotations

from fastapi import APIRouter

from tunix_rt.registry import queries
from tunix_rt.registry.queries import NotFound
from tunix_rt.service.deps import SettingsDep
from tunix_rt.service.schemas import ModelVersionDetail, ModelVersionPublic

router = APIRouter(prefix="/api/models", tags=["models"])


@router.get("", response_model=list[ModelVersionPublic])
def list_models(settings: SettingsDep, name: str | None = None):
    return queries.list_models(name=name, url=settings.database_url)


@router.get("/versions/{sha256}", response_model=ModelVersionDetail)
def show_version(sha256: str, settings: SettingsDep):
    for m in queries.list_models(url=settings.database_url):
        if m.sha256 == sha256:
            return m
    raise NotFound(f"no model version {sha256}")


@router.get("/{name}", response_model=list[ModelVersionPublic])
def model_versions(name: str, settings: SettingsDep):
    rows = queries.list_models(name=name, url=settings.database_url)
    if not rows:
        raise NotFound(f"no model {name!r}")
    return rows
