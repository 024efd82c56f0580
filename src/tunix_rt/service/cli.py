"""`tunix-rt serve`: the REST API and web UI on 127.0.0.1 (unless --host says otherwise)."""

from __future__ import annotations

from typing import Annotated

import typer

from tunix_rt.home import Home


def serve(
    host: Annotated[str, typer.Option(help="Address to bind; 0.0.0.0 exposes it to the network.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8765,
) -> None:
    """Serve the registry API and the web UI. The token is created on first start (stored in
    <home>/service_token, mode 0600) and printed."""
    import uvicorn

    from tunix_rt.service.app import create_app
    from tunix_rt.service.settings import Settings, load_or_create_token

    home = Home.resolve().ensure()
    token, created = load_or_create_token(home)
    settings = Settings.from_home(home)
    app = create_app(settings)
    shown = "localhost" if host in ("127.0.0.1", "0.0.0.0") else host
    print(f"token ({'new, ' if created else ''}stored in {home.root / 'service_token'}): {token}")
    print(f"web UI: http://{shown}:{port}/#token={token}")
    print(f"API:    curl -H 'Authorization: Bearer {token}' http://{shown}:{port}/api/runs")
    uvicorn.run(app, host=host, port=port, log_level="info")
