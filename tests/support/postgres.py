"""A PostgreSQL server of a test's own, to restart at will: the machine's shared server is never touched.

It holds a copy of the test database (rows included) under the same name, so a control plane pointed
at it and the test reading it see what the test's fixtures made.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path

from django.db import connection

from tests.support.services import free_port

BIN = max(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name))


def as_postgres(args: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: a root test runs it as the postgres account."""
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


class PrivateCluster:
    def __init__(self):
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="lebureau-pg-"))
        self.data = self.root / "data"

    def __enter__(self) -> PrivateCluster:
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
        initdb = [str(BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-sync"]
        subprocess.run(as_postgres(initdb), check=True, capture_output=True)
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self._ctl("stop", "-m", "immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def _ctl(self, *args: str) -> None:
        subprocess.run(as_postgres([str(BIN / "pg_ctl"), "-D", str(self.data), "-w", *args]), check=True)

    def start(self) -> None:
        # Loopback TCP only; its socket stays in its own directory. Durability is not under test.
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=off"
        self._ctl("start", "-o", options, "-l", str(self.root / "postgresql.log"))

    def restart(self) -> None:
        """What an operator's restart does: every open connection is cut, then the server is back."""
        self._ctl("stop", "-m", "fast")
        self.start()

    def url(self, name: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{name}"

    def copy_of(self, settings_dict: dict) -> str:
        """Copy a database of the shared server here, rows included; returns its URL here."""
        name = settings_dict["NAME"]
        source = f"postgres://{settings_dict['USER']}@{settings_dict['HOST']}:{settings_dict['PORT']}/{name}"
        psql = [str(BIN / "psql"), "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(self.port)]
        psql += ["-U", "postgres"]
        subprocess.run([*psql, "-c", f'CREATE DATABASE "{name}"'], check=True)
        dump = subprocess.Popen([str(BIN / "pg_dump"), "--no-owner", source], stdout=subprocess.PIPE)
        subprocess.run([*psql, "-d", name], stdin=dump.stdout, check=True, capture_output=True)
        assert dump.wait() == 0, "pg_dump failed"
        return self.url(name)


@contextmanager
def reading(cluster: PrivateCluster):
    """The test's own connection goes to `cluster` (its copy of the test database) for the block."""
    saved = dict(connection.settings_dict)
    connection.close()
    connection.settings_dict.update(HOST="127.0.0.1", PORT=str(cluster.port))
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)
