"""Sweeps (tunix_rt.sweep): list, and one sweep with its trials and best config. Sweeps are
made with `tunix-rt sweep`; their trials run as queue jobs (see /api/jobs)."""

from __future__ import annotations

from fastapi import APIRouter

from tunix_rt.service.deps import SettingsDep
from tunix_rt.service.schemas import SweepDetail, SweepSummary

router = APIRouter(prefix="/api/sweeps", tags=["sweeps"])


@router.get("", response_model=list[SweepSummary])
def list_sweeps(settings: SettingsDep):
    from tunix_rt.sweep.study import list_sweeps

    return list_sweeps(url=settings.database_url)


@router.get("/{name}", response_model=SweepDetail)
def show_sweep(name: str, settings: SettingsDep):
    from tunix_rt.sweep.study import describe

    return describe(name, url=settings.database_url)
