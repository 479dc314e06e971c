"""A TCP fault proxy for tests and drills: forwards every connection to one target and, on demand,
adds latency, cuts bandwidth, resets connections or blackholes them (asyncio in a daemon thread;
the public methods are thread-safe)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["FaultProxy", "ProxyFigures"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
_CHUNK = 65536
UP, DOWN = "up", "down"  # client -> target, target -> client


@dataclass(frozen=True)
class ProxyFigures:
    """What the proxy has done so far: bytes forwarded per direction (up: client to target),
    connections accepted, open now, reset by `reset`, and refused while refusing."""

    bytes_up: int
    bytes_down: int
    accepted: int
    open: int
    reset: int
    refused: int


class _Conn:
    """One proxied connection: the client's and the target's transports."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.target: asyncio.StreamWriter | None = None
        self.tasks: list[asyncio.Task[None]] = []

    def abort(self, rst: bool) -> None:
        for writer in (self.client, self.target):
            if writer is not None:
                _abort(writer, rst)
        for task in self.tasks:
            task.cancel()


def _abort(writer: asyncio.StreamWriter, rst: bool) -> None:
    """Close at once; with `rst`, SO_LINGER 0 makes the kernel send RST instead of FIN."""
    sock = writer.get_extra_info("socket")
    if rst and sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    """Listens on `host:port` (0: a free port) and forwards each connection to
    `target_host:target_port`, faults included:

    - `set_latency(ms, jitter_ms)`: every chunk waits ms (+ up to jitter_ms) in each direction;
    - `set_bandwidth(bytes_per_second)`: each direction is cut to that rate, shared by all
      connections;
    - `reset(refuse_seconds)`: every open connection is reset (RST), and new ones are reset as
      they arrive for `refuse_seconds`;
    - `blackhole(seconds)`: connections stay open but nothing passes either way (bytes are held,
      and delivered when it ends, as TCP would after a partition heals); new connections wait
      too;
    - `heal()`: everything back to normal.

    Use as a context manager, or `start()` and `stop()`.
    """

    def __init__(
        self, target_host: str, target_port: int, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.target = (target_host, target_port)
        self.host = host
        self.port = port
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._conns: set[_Conn] = set()
        self._latency = (0.0, 0.0)
        self._rate: float | None = None
        self._free_at = {UP: 0.0, DOWN: 0.0}
        self._refuse_until = 0.0
        self._flowing = asyncio.Event()  # cleared while blackholed
        self._flowing.set()
        self._blackhole_end: asyncio.TimerHandle | None = None
        self._counts = {"up": 0, "down": 0, "accepted": 0, "reset": 0, "refused": 0}

    def __repr__(self) -> str:
        return f"FaultProxy({self.address} -> {self.target[0]}:{self.target[1]})"

    @property
    def address(self) -> str:
        """host:port where clients connect."""
        return f"{self.host}:{self.port}"

    # --- life -----------------------------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> FaultProxy:
        """Start the event loop thread and listen; returns once the port accepts connections."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(self._listen())
            except BaseException as exc:  # reported to start()'s caller
                failure.append(exc)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()
            self._loop.close()

        self._thread = threading.Thread(target=run, name=f"fault-proxy-{self.port}", daemon=True)
        self._thread.start()
        if not ready.wait(timeout) or failure:
            raise OSError(f"fault proxy could not listen on {self.address}: {failure[:1]}")
        logger.info("fault proxy %s -> %s:%d", self.address, *self.target)
        return self

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])

    def stop(self, timeout: float = 10.0) -> None:
        """Close the listener and every connection, and end the thread."""
        loop, thread = self._loop, self._thread
        if thread is None or not thread.is_alive():
            return

        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for conn in list(self._conns):
                conn.abort(rst=False)
            self._conns.clear()
            # Connections still waiting (a blackhole, a connect in flight) end here, not with
            # the loop ("Task was destroyed but it is pending").
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), loop).result(timeout)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- faults (thread-safe) -------------------------------------------------------------------

    def set_latency(self, ms: float, jitter_ms: float = 0.0) -> None:
        """Delay every chunk by `ms` plus a random 0..`jitter_ms`, in each direction (0: none)."""
        self._call(lambda: setattr(self, "_latency", (ms / 1000, jitter_ms / 1000)))

    def set_bandwidth(self, bytes_per_second: float | None) -> None:
        """Cut each direction to `bytes_per_second`, shared by all connections (None: no cut)."""

        def apply() -> None:
            self._rate = bytes_per_second
            self._free_at = {UP: 0.0, DOWN: 0.0}

        self._call(apply)

    def reset(self, refuse_seconds: float = 0.0) -> int:
        """Reset (RST) every open connection, and every new one for `refuse_seconds`.

        Returns:
            How many open connections were reset.
        """

        def apply() -> int:
            self._refuse_until = self._loop.time() + refuse_seconds
            conns = list(self._conns)
            for conn in conns:
                conn.abort(rst=True)
            self._conns.clear()
            self._counts["reset"] += len(conns)
            return len(conns)

        return self._call(apply)

    def blackhole(self, seconds: float | None = None) -> None:
        """Hold every byte either way for `seconds` (None: until `heal`)."""

        def apply() -> None:
            self._flowing.clear()
            if self._blackhole_end is not None:
                self._blackhole_end.cancel()
            if seconds is not None:
                self._blackhole_end = self._loop.call_later(seconds, self._flowing.set)

        self._call(apply)

    def heal(self) -> None:
        """No latency, no bandwidth cut, no refusing, no blackhole."""

        def apply() -> None:
            self._latency, self._rate, self._refuse_until = (0.0, 0.0), None, 0.0
            if self._blackhole_end is not None:
                self._blackhole_end.cancel()
            self._flowing.set()

        self._call(apply)

    def figures(self) -> ProxyFigures:
        """Counts so far (see `ProxyFigures`)."""

        def read() -> ProxyFigures:
            c = self._counts
            return ProxyFigures(
                c["up"], c["down"], c["accepted"], len(self._conns), c["reset"], c["refused"]
            )

        return self._call(read)

    def _call(self, fn: Callable[[], _T]) -> _T:
        """Run `fn` in the loop's thread (the fault state is the loop's alone) and return it."""
        if self._thread is None or not self._thread.is_alive():
            raise RuntimeError(f"{self!r} is not started: call start() first")

        async def run() -> _T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    # --- forwarding -----------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._loop.time() < self._refuse_until:
            self._counts["refused"] += 1
            _abort(writer, rst=True)
            return
        self._counts["accepted"] += 1
        conn = _Conn(writer)
        self._conns.add(conn)
        try:
            await self._flowing.wait()  # a blackhole holds new connections too
            up_reader, conn.target = await asyncio.open_connection(*self.target)
        except (OSError, asyncio.CancelledError) as exc:
            logger.debug("fault proxy: no connection to %s:%d: %s", *self.target, exc)
            self._conns.discard(conn)
            _abort(writer, rst=False)
            return
        conn.tasks = [
            asyncio.ensure_future(self._pump(reader, conn.target, UP)),
            asyncio.ensure_future(self._pump(up_reader, writer, DOWN)),
        ]
        await asyncio.gather(*conn.tasks, return_exceptions=True)
        if conn in self._conns:
            self._conns.discard(conn)
            conn.abort(rst=False)

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str
    ) -> None:
        try:
            while True:
                data = await reader.read(_CHUNK)
                if not data:
                    with contextlib.suppress(OSError):
                        writer.write_eof()
                    return
                await self._flowing.wait()
                delay, jitter = self._latency
                if delay or jitter:
                    await asyncio.sleep(delay + random.uniform(0, jitter))
                    await self._flowing.wait()
                await self._send(writer, data, direction)
        except (OSError, asyncio.IncompleteReadError):
            # One side went away: end the other side too.
            writer.transport.abort()

    async def _send(self, writer: asyncio.StreamWriter, data: bytes, direction: str) -> None:
        view = memoryview(data)
        while view:
            rate = self._rate
            piece = view if rate is None else view[: max(1, int(rate / 20))]
            if rate is not None:
                await self._pace(len(piece), rate, direction)
            writer.write(bytes(piece))
            await writer.drain()
            self._counts[direction] += len(piece)
            view = view[len(piece) :]

    async def _pace(self, size: int, rate: float, direction: str) -> None:
        """Wait for this piece's turn on the direction's shared link of `rate` bytes/s."""
        now = self._loop.time()
        start = max(now, self._free_at[direction])
        self._free_at[direction] = start + size / rate
        await asyncio.sleep(start + size / rate - now)
