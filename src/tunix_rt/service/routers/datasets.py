"""Datasets: list, show, preview records, and upload a JSONL (validated exactly as `data
import` validates it; errors carry line numbers), which becomes an import job."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Form, HTTPException, UploadFile

from tunix_rt.registry import queries, queue
from tunix_rt.registry.jobs import NAME, UPLOADS_DIR
from tunix_rt.service.deps import SettingsDep, paged
from tunix_rt.service.schemas import DatasetDetail, DatasetPublic, UploadAccepted

router = APIRouter(prefix="/api/datasets", tags=["datasets"])
MAX_ERRORS_SHOWN = 100
RecordPage = paged(20, 500)


@router.get("", response_model=list[DatasetPublic])
def list_datasets(settings: SettingsDep, name: str | None = None):
    return queries.list_datasets(name=name, url=settings.database_url)


@router.get("/{name}/{version}", response_model=DatasetDetail)
def show_dataset(name: str, version: str, settings: SettingsDep):
    return queries.get_dataset(name, version, url=settings.database_url)


@router.get("/{name}/{version}/records")
def dataset_records(name: str, version: str, settings: SettingsDep, page: RecordPage) -> list[dict]:
    """A page of data.jsonl (the file on disk is the source of truth)."""
    ds = queries.get_dataset(name, version, url=settings.database_url)
    path = Path(ds.path) / "data.jsonl"
    if not path.resolve().is_relative_to(settings.home.resolve()):
        raise HTTPException(404, "dataset is outside the home")
    out = []
    with path.open(encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if i >= page.offset + page.limit:
                break
            if i >= page.offset:
                out.append(json.loads(line))
    return out


@router.post("", status_code=202, response_model=UploadAccepted)
def upload_dataset(
    settings: SettingsDep,
    file: UploadFile,
    name: Annotated[str, Form(pattern=NAME)],
    format: Annotated[str, Form(pattern=r"^(auto|record|gsm8k|traces|generic|pairs)$")] = "auto",
):
    """Store the upload under <home>/uploads/<sha256>.jsonl once it validates, and queue an
    import job that writes dataset version `job<ID>`."""
    from tunix_rt.traces.reader import scan

    uploads = settings.home / UPLOADS_DIR
    uploads.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".upload-", suffix=".jsonl", dir=uploads)
    try:
        digest = _save_limited(file, fd, settings.max_upload_bytes)
        label = _label(file.filename)
        result = scan(tmp, format, label=label)
        if result.errors:
            errors = [{"line": e.line, "field": e.field, "reason": e.reason, "message": str(e)}
                      for e in result.errors[:MAX_ERRORS_SHOWN]]
            raise HTTPException(422, {"message": result.message("nothing imported").splitlines()[0],
                                      "errors": errors, "total_errors": len(result.errors)})
        final = uploads / f"{digest}.jsonl"
        os.replace(tmp, final)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    job_id = queue.enqueue("import", {"upload": final.name, "name": name, "format": result.format, "filename": label},
                           max_attempts=settings.max_attempts, url=settings.database_url)
    return UploadAccepted(job_id=job_id, dataset=f"{name}@job{job_id}", records=len(result.records), format=result.format)


def _save_limited(file: UploadFile, fd: int, limit: int) -> str:
    """Copy the upload to fd, refusing (413) past `limit` bytes; returns its sha256."""
    h, total = hashlib.sha256(), 0
    with os.fdopen(fd, "wb") as out:
        while block := file.file.read(1 << 20):
            total += len(block)
            if total > limit:
                raise HTTPException(413, f"upload is over the limit of {limit:,} bytes")
            h.update(block)
            out.write(block)
    if total == 0:
        raise HTTPException(422, {"message": "empty upload", "errors": [{"line": 1, "field": "<file>", "reason": "empty file, no records"}]})
    return h.hexdigest()


def _label(filename: str | None) -> str:
    """The client's file name, reduced to a safe basename: for error messages, and GSM8K ids
    are named after it (as `data import` names them after its path; each run of other
    characters becomes one "_", which the ids' naming folds like any separator)."""
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", os.path.basename((filename or "upload.jsonl").replace("\\", "/")))
    return base[-255:] or "upload.jsonl"
