"""The worker fault drill's tools: a TCP proxy in front of PostgreSQL that can drop every
connection or refuse new ones (the database gone), and the stub scorer the drill's
workers run (CPU only: it sleeps through its cases, and notes each scoring it completes)."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from typing import Any


class Proxy:
    """127.0.0.1:<port> -> `upstream`, one pair of pump threads per connection."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.refusing = threading.Event()
        self.closed = threading.Event()
        self.lock = threading.Lock()
        self.pairs: set[tuple[socket.socket, socket.socket]] = set()
        self.dropped = 0  # connections cut by `drop`
        self.refused = 0  # connections turned away while refusing
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            if self.refusing.is_set():
                self.refused += 1
                _close(client)
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                _close(client)
                continue
            client.settimeout(None)
            server.settimeout(None)
            pair = (client, server)
            with self.lock:
                self.pairs.add(pair)
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b, pair), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, pair: Any) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self._end(pair)

    def _end(self, pair: Any) -> None:
        with self.lock:
            self.pairs.discard(pair)
        for s in pair:
            _close(s)

    def drop(self) -> int:
        """Cut every open connection, both ways; how many there were."""
        with self.lock:
            pairs = list(self.pairs)
        for p in pairs:
            self._end(p)
        self.dropped += len(pairs)
        return len(pairs)

    def outage(self, seconds: float) -> None:
        """The database disappears for `seconds`: every connection cut, new ones refused."""
        self.refusing.set()
        self.drop()
        time.sleep(seconds)
        self.refusing.clear()

    def close(self) -> None:
        self.closed.set()
        self.drop()
        _close(self.sock)


def _close(s: socket.socket) -> None:
    # shutdown first: it wakes a thread blocked in recv on it, close alone does not.
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        s.close()


def drill_scorer(files, options, *, secret, progress):
    """Scores a drill job: `cases.txt` cases (4) of `sleep.txt` / cases seconds each (0.5 s
    in all), each announced by `progress` as the real scorer does (where its worker may
    stop it). A job is *scored* when its scoring ran through to its score: then, and only
    then, its tag is appended to FA_DRILL_SCORED (`tag pid time`), whether or not its
    result is then stored. Two lines of one tag are one job scored twice."""
    from harness.submissions.scoring import ScoreReport

    n = int(files.get("cases.txt", "4"))
    for i in range(n):
        progress("check", f"case-{i + 1}")
        time.sleep(float(files.get("sleep.txt", "0.5")) / n)
    tag = files["tag.txt"].strip()
    path = os.environ.get("FA_DRILL_SCORED")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{tag} {os.getpid()} {time.time():.2f}\n".encode())
        finally:
            os.close(fd)
    return ScoreReport("scored", "fine", score=1.0 + int(tag) / 1000)
