"""GET /api/health: the one API route that needs no token (it says nothing about the data)."""

from fastapi import APIRouter

from tunix_rt import __version__

router = APIRouter(prefix="/api", tags=["health"])


@router.get("/health")
def health() -> dict[str, str]:
    return {"status": "ok", "version": __version__}
