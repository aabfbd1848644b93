"""The admission controller's liveness and readiness endpoint (``--health-address``).

* ``GET /healthz`` (liveness) answers 200 whenever the event loop answers at all: a replica whose
  loop is stuck answers nothing, and the kubelet restarts it.
* ``GET /readyz`` (readiness) answers 200 while the replica leads, or stands by with a fresh view
  (every informer listed, none failing to list), so it could decide at once if it took over;
  503 otherwise. Either way the body is the report (``ready``, ``leading``, ``synced`` per kind,
  ``served`` namespaces).

It runs in the controller's own event loop (aiohttp), so liveness is the loop's liveness.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from dispatch_kubeflow.metrics import parse_address

log = logging.getLogger(__name__)

Report = Callable[[], dict[str, Any]]


def health_app(report: Report) -> web.Application:
    """The two routes over ``report``, whose ``ready`` decides the readiness answer."""

    async def alive(_: web.Request) -> web.Response:
        return web.json_response({"alive": True})

    async def ready(_: web.Request) -> web.Response:
        body = report()
        return web.json_response(body, status=200 if body.get("ready") else 503)

    app = web.Application()
    app.router.add_get("/healthz", alive)
    app.router.add_get("/readyz", ready)
    return app


@contextlib.asynccontextmanager
async def serving_health(address: str | None, report: Report) -> AsyncIterator[int | None]:
    """Serve the endpoint on ``address`` (HOST:PORT; port 0 picks one) while in the block;
    yield the port, or None when ``address`` is None."""
    if address is None:
        yield None
        return
    host, port = parse_address(address)
    runner = web.AppRunner(health_app(report), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = int(runner.addresses[0][1]) if runner.addresses else port
        log.info("admission: health endpoint on %s:%d (/healthz, /readyz)", host, bound)
        yield bound
    finally:
        await runner.cleanup()
