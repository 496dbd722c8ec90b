"""The view's web server (aiohttp.web): read-only pages of a :class:`~packer.tools.view.data.DatasetView`.

Routes name samples by split and index only (``/sample/<split>/<i>``): a split name is looked up among
the dataset's splits and an index is bounds-checked, so no request names a file and ``../`` reaches
nothing (it matches no route: 404). Bound to anything but localhost, every request needs the random
token printed in the URL (``?token=``; the first page sets it as a cookie).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web

from packer.tools.view.pages import PER_PAGE, render_grid, render_overview, render_rejects, render_sample
from packer.tools.view.data import DatasetView, Split
from readers.contract.messages import one_line

__all__ = ["make_app", "Server", "LOCAL_HOSTS"]

log = logging.getLogger(__name__)

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
_MAX_PER_PAGE = 1000
_VIEW = web.AppKey("view", DatasetView)
_TOKEN = web.AppKey("token", str)
_SEED = web.AppKey("seed", object)
_POOL = web.AppKey("pool", ThreadPoolExecutor)


def _int(request: web.Request, name: str, default: int | None) -> int | None:
    text = request.query.get(name, "").strip()
    if text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise web.HTTPBadRequest(text=f"{name}={text!r}: not an integer") from None


def _split(request: web.Request, name: str | None) -> Split:
    try:
        return request.app[_VIEW].split(name)
    except KeyError:
        raise web.HTTPNotFound(text=f"no split {name!r}") from None


def _sample(request: web.Request) -> tuple[Split, int]:
    split = _split(request, request.match_info["split"])
    i = int(request.match_info["index"])  # the route takes digits only
    if not 0 <= i < split.samples:
        raise web.HTTPNotFound(text=f"no sample {i}: {split.name} has {split.samples}")
    return split, i


@web.middleware
async def _guard(request: web.Request, handler: Any) -> web.StreamResponse:
    """Read-only (GET and HEAD), and the token when the server has one."""
    if request.method not in ("GET", "HEAD"):
        raise web.HTTPMethodNotAllowed(request.method, ["GET", "HEAD"])
    token = request.app[_TOKEN]
    if token:
        given = request.query.get("token") or request.cookies.get("view_token") or ""
        if not secrets.compare_digest(given.encode(), token.encode()):
            raise web.HTTPForbidden(text="a token is needed: open the URL that pack-dataset view printed")
    try:
        response = await handler(request)
    except web.HTTPException:
        raise
    except Exception as exc:  # noqa: BLE001 - a page that fails: one line in the log and in the reply
        message = f"{request.path}: {one_line(exc, kind=True)}"
        log.error("%s", message)
        raise web.HTTPInternalServerError(text=message) from None
    if token and request.query.get("token") == token:
        response.set_cookie("view_token", token, httponly=True, samesite="Strict")
    return response


async def _threaded(request: web.Request, fn: Any, *args: Any, **kw: Any) -> Any:
    """Reads and decodes run off the event loop, one at a time (the view's readers are not shared
    between threads)."""
    return await asyncio.get_running_loop().run_in_executor(request.app[_POOL], lambda: fn(*args, **kw))


def _html(text: str) -> web.Response:
    return web.Response(text=text, content_type="text/html")


async def overview(request: web.Request) -> web.Response:
    return _html(await _threaded(request, render_overview, request.app[_VIEW], request.app[_TOKEN]))


async def grid(request: web.Request) -> web.Response:
    split = _split(request, request.query.get("split"))
    per = max(1, min(_int(request, "per", PER_PAGE) or PER_PAGE, _MAX_PER_PAGE))
    page = max(0, _int(request, "page", 0) or 0)
    cls = _int(request, "cls", None)
    seed = _int(request, "seed", request.app[_SEED])  # type: ignore[arg-type]
    return _html(await _threaded(request, render_grid, request.app[_VIEW], split, page=page, per=per, cls=cls,
                                 seed=seed, token=request.app[_TOKEN]))


async def sample_page(request: web.Request) -> web.Response:
    split, i = _sample(request)
    return _html(await _threaded(request, render_sample, split, i, request.app[_TOKEN]))


async def sample_json(request: web.Request) -> web.Response:
    split, i = _sample(request)
    return web.Response(text=json.dumps(await _threaded(request, split.sample, i), indent=1),
                        content_type="application/json")


async def image(request: web.Request) -> web.Response:
    split, i = _sample(request)
    field = request.query.get("field", "image")
    if field != "image" and field not in split.second_images:
        raise web.HTTPNotFound(text=f"no image field {field!r}")
    try:
        body, kind = await _threaded(request, split.image, i, field)
    except (OSError, ValueError) as exc:  # a damaged sample: its one line (the sample page shows it too)
        raise web.HTTPInternalServerError(text=str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    return web.Response(body=body, content_type=kind)


async def rejects(request: web.Request) -> web.Response:
    return _html(await _threaded(request, render_rejects, request.app[_VIEW], request.app[_TOKEN]))


def make_app(view: DatasetView, token: str = "", seed: int | None = None) -> web.Application:
    """The aiohttp application serving ``view`` (``token``: required on every request when set;
    ``seed``: the grid's default shuffle, None for index order)."""
    app = web.Application(middlewares=[_guard])
    app[_VIEW], app[_TOKEN], app[_SEED] = view, token, seed
    app[_POOL] = ThreadPoolExecutor(1, thread_name_prefix="pack-dataset-view")

    async def stop_pool(app: web.Application) -> None:
        app[_POOL].shutdown(wait=True)

    app.on_cleanup.append(stop_pool)
    app.router.add_get("/", overview)
    app.router.add_get("/grid", grid)
    app.router.add_get(r"/sample/{split}/{index:\d+}.json", sample_json)
    app.router.add_get(r"/sample/{split}/{index:\d+}", sample_page)
    app.router.add_get(r"/image/{split}/{index:\d+}", image)
    app.router.add_get("/rejects", rejects)
    return app


class Server:
    """The view served from a background thread: :attr:`url` to open, :meth:`close` to stop.
    ``host`` other than localhost: a random token is required (``token=`` sets it, for tests)."""

    def __init__(self, view: DatasetView, host: str = "127.0.0.1", port: int = 0, seed: int | None = None,
                 token: str | None = None) -> None:
        self.token = token if token is not None else ("" if host in LOCAL_HOSTS else secrets.token_urlsafe(16))
        self._runner = web.AppRunner(make_app(view, self.token, seed), access_log=None)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.port = 0
        self._thread = threading.Thread(target=self._serve, args=(host, port), name="pack-dataset-view", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise OSError(f"cannot listen on {host}:{port}: {self._error}")
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else "[::1]" if host == "::" else (
            f"[{host}]" if ":" in host else host)
        self.url = f"http://{shown}:{self.port}/" + (f"?token={self.token}" if self.token else "")

    def _serve(self, host: str, port: int) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            try:
                self._loop.run_until_complete(self._runner.setup())
                self._loop.run_until_complete(web.TCPSite(self._runner, host, port).start())
                self.port = int(self._runner.addresses[0][1])
            except OSError as exc:
                self._error = exc
                return
            finally:
                self._ready.set()
            self._loop.run_forever()
        finally:
            self._loop.run_until_complete(self._runner.cleanup())
            self._loop.close()

    def close(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
