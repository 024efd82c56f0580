"""`tunix-rt serve`: the REST API and web UI on 127.0.0.1 (unless --host says otherwise)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from tunix_rt.home import Home


def serve(
    host: Annotated[str, typer.Option(help="Address to bind; 0.0.0.0 exposes it to the network.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8765,
    device: Annotated[Optional[str], typer.Option(help="Where /v1 models run: auto | cpu | cuda (default: auto).")] = None,
    max_models: Annotated[Optional[int], typer.Option(help="Models kept loaded (LRU, one in use never unloaded; default 2).")] = None,
    max_batch: Annotated[Optional[int], typer.Option(help="Completions decoded together per model (default: eval's batch size).")] = None,
    max_queue: Annotated[Optional[int], typer.Option(help="Requests waiting per model before 429 (default 64).")] = None,
    max_tokens: Annotated[Optional[int], typer.Option(help="Cap on a request's max_tokens (default 1024).")] = None,
    load_wait: Annotated[Optional[float], typer.Option(help="Seconds a request for a model not loaded waits for a loaded "
                                                            "one to finish its requests before a 503 (default 30).")] = None,
    tools: Annotated[bool, typer.Option("--tools/--no-tools", help="Served runs call their tools (config.yaml `tools`).")] = True,
    weights: Annotated[str, typer.Option("--weights", help="fp32 | int8 | int4: serve on weight-only int8 or int4 weights (Gemma 3/2; faster, not bit-exact).")] = "fp32",
) -> None:
    """Serve the registry API and the web UI. The token is created on first start (stored in
    <home>/service_token, mode 0600) and printed."""
    import uvicorn

    from tunix_rt.service.app import create_app
    from tunix_rt.service.settings import Settings, load_or_create_token

    from tunix_rt.eval.int8_weights import check_weights

    check_weights(weights, field="--weights")
    home = Home.resolve().ensure()
    token, created = load_or_create_token(home)
    given = {"serve_device": device, "serve_max_models": max_models, "serve_max_batch": max_batch,
             "serve_max_queue": max_queue, "serve_max_tokens": max_tokens, "serve_load_wait_s": load_wait,
             "serve_tools": None if tools else False, "serve_weights": None if weights == "fp32" else weights}
    settings = Settings.from_home(home, **{k: v for k, v in given.items() if v is not None})
    app = create_app(settings)
    shown = "localhost" if host in ("127.0.0.1", "0.0.0.0") else host
    print(f"token ({'new, ' if created else ''}stored in {home.root / 'service_token'}): {token}")
    print(f"web UI: http://{shown}:{port}/#token={token}")
    print(f"API:    curl -H 'Authorization: Bearer {token}' http://{shown}:{port}/api/runs")
    print(f"OpenAI: base_url=http://{shown}:{port}/v1 api_key={token}")
    uvicorn.run(app, host=host, port=port, log_level="info")
