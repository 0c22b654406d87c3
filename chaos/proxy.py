"""A TCP proxy that can cut a link the way a network partition does.

``blackhole()`` stops forwarding in both directions without closing a socket: bytes
already sent wait (in the kernel's buffers, or held here), new connections are
accepted but get no answer, exactly what a client sees when packets are dropped
(a timeout, never a refusal). ``heal()`` resumes and delivers everything that was
held, in order, as TCP retransmission does after a partition heals. That includes
requests whose client gave up and reconnected meanwhile: late duplicates reach the
server, which is what the fencing has to survive.

The proxy runs an asyncio loop in a daemon thread of the runner; the cut and the heal
are called from the runner's own thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass, field

from testproject.harness import free_port

_CHUNK = 65536


@dataclass
class ProxyStats:
    connections: int = 0  # accepted in all
    forwarded_bytes: int = 0
    held_connections: int = 0  # open while the link was cut, at the last heal()


@dataclass
class BlackholeProxy:
    """127.0.0.1:``port`` → ``upstream_host``:``upstream_port``, cuttable."""

    upstream_port: int
    upstream_host: str = "127.0.0.1"
    port: int = field(default_factory=free_port)
    stats: ProxyStats = field(default_factory=ProxyStats)

    def __post_init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._flowing: asyncio.Event | None = None
        self._open: set[asyncio.Task[None]] = set()
        self._ready = threading.Event()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    # -- control, from the runner's thread ---------------------------------------------
    def start(self) -> BlackholeProxy:
        self._thread = threading.Thread(target=self._serve, name="chaos-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"proxy on port {self.port} did not start")
        return self

    def blackhole(self) -> None:
        """Stop forwarding, both ways; keep every socket open."""
        self._call(lambda: self._flowing.clear())  # type: ignore[union-attr]

    def heal(self) -> None:
        """Forward again, held bytes first."""
        if self.cut:
            self.stats.held_connections = len(self._open)
        self._call(lambda: self._flowing.set())  # type: ignore[union-attr]

    @property
    def cut(self) -> bool:
        return self._flowing is not None and not self._flowing.is_set()

    def stop(self) -> None:
        loop = self._loop
        if loop is None or self._thread is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop already stopped
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(10)
        self._thread.join(10)
        self._loop = None

    def _call(self, fn) -> None:  # type: ignore[no-untyped-def]
        assert self._loop is not None, "proxy not started"
        done = threading.Event()

        def run() -> None:
            fn()
            done.set()

        self._loop.call_soon_threadsafe(run)
        done.wait(5)

    # -- the loop ----------------------------------------------------------------------
    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._listen())
            self._ready.set()
            loop.run_forever()
        finally:
            loop.close()

    async def _listen(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._accepted, "127.0.0.1", self.port)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._open):
            task.cancel()
        await asyncio.gather(*self._open, return_exceptions=True)
        asyncio.get_running_loop().call_soon(asyncio.get_running_loop().stop)

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._open.add(task)
        upstream_writer = None
        try:
            assert self._flowing is not None
            await self._flowing.wait()  # a cut link answers nothing, not even a refusal
            up_reader, upstream_writer = await asyncio.open_connection(
                self.upstream_host, self.upstream_port
            )
            await asyncio.gather(self._pump(reader, upstream_writer), self._pump(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # stop(): end quietly (asyncio's stream callback would report a cancelled
            # handler as an error).
            pass
        finally:
            self._open.discard(task)
            for w in (writer, upstream_writer):
                if w is not None:
                    w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        try:
            while True:
                await self._flowing.wait()
                data = await reader.read(_CHUNK)
                if not data:
                    break
                await self._flowing.wait()  # read before the cut: held until the heal
                writer.write(data)
                await writer.drain()
                self.stats.forwarded_bytes += len(data)
        except OSError:
            pass
        finally:
            # One side closed: close the other so neither end waits on a dead link.
            with contextlib.suppress(OSError):
                writer.close()
