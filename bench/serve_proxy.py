"""A round-robin HTTP proxy over engine replicas (no cache-aware routing), for the two-replica scenario.

    <engine venv>/bin/python bench/serve_proxy.py PORT http://127.0.0.1:A http://127.0.0.1:B

Each request goes to the next replica in turn and its reply is streamed back as it comes (server-sent events
included), so TTFT measured through the proxy is the replica's. Runs in the engine's virtualenv (aiohttp comes
with vLLM).
"""

from __future__ import annotations

import itertools
import sys

from aiohttp import ClientSession, ClientTimeout, web

HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


async def relay(request: web.Request, url: str, body: bytes) -> web.StreamResponse:
    """Send ``request`` (its method, headers but the hop-by-hop ones, and ``body``) to ``url``; stream the reply
    back as it comes (server-sent events included), so TTFT measured through the proxy is the replica's."""
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
    async with request.app["session"].request(request.method, url, data=body, headers=headers) as upstream:
        reply = web.StreamResponse(status=upstream.status, headers={
            k: v for k, v in upstream.headers.items() if k.lower() not in HOP})
        await reply.prepare(request)
        async for piece in upstream.content.iter_any():
            await reply.write(piece)
        await reply.write_eof()
        return reply


def make_app(backends: list[str]) -> web.Application:
    turn = itertools.cycle(backends)
    app = web.Application(client_max_size=1 << 28)

    async def session(app: web.Application):
        app["session"] = ClientSession(timeout=ClientTimeout(total=None))
        yield
        await app["session"].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        return await relay(request, next(turn) + request.rel_url.path_qs, await request.read())

    app.cleanup_ctx.append(session)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit("usage: serve_proxy.py PORT BACKEND_URL [BACKEND_URL ...]")
    web.run_app(make_app(sys.argv[2:]), host="127.0.0.1", port=int(sys.argv[1]), print=None)


if __name__ == "__main__":
    main()
