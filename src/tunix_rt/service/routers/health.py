"""GET /api/health: the one API route that needs no token (it says nothing about the data)."""

from fastapi import APIRouter

from tunix_rt import __version__

router = APIRouter(prefix="/api", tags=["health"])


@router.get("/health")
async def health() -> dict[str, str]:
    """On the event loop itself: it needs no worker thread, so it answers however busy the
    thread pool is (model loads, tokenizing, slow queries)."""
    return {"status": "ok", "version": __version__}
