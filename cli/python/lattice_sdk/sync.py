"""``SyncLatticeClient``: the async client's methods as plain calls, for scripts and notebooks.

It runs the async client on an event loop of its own in a background thread, so it also works where
an event loop is already running (Jupyter). Async iterators (``watch``, ``stream_logs``) become
generators.
"""

import asyncio
import threading
from typing import Any, Iterator

from .client import LatticeClient


class SyncLatticeClient:
    """Same arguments and methods as :class:`LatticeClient`, without ``await``."""

    def __init__(self, *args: Any, **kwargs: Any):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="lattice-sdk", daemon=True)
        self._thread.start()
        self._client = self._run(_make(args, kwargs))

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _iterate(self, agen) -> Iterator[Any]:
        try:
            while True:
                try:
                    yield self._run(agen.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            self._run(agen.aclose())

    def __getattr__(self, name: str):
        attr = getattr(self._client, name)
        if name in ("watch", "stream_logs"):
            return lambda *a, **k: self._iterate(attr(*a, **k))
        if not callable(attr):
            return attr

        def call(*a: Any, **k: Any):
            return self._run(attr(*a, **k))

        return call

    def close(self) -> None:
        if self._loop.is_running():
            self._run(self._client.aclose())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.close()

    def __enter__(self) -> "SyncLatticeClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


async def _make(args, kwargs) -> LatticeClient:
    # Created on the client's own loop (httpx binds its connection pool to it).
    return LatticeClient(*args, **kwargs)
