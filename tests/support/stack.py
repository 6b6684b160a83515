"""A control plane of a test's own, for faults the suite's shared services must not suffer: its own
Redis, daphne and lifecycle worker, on the test database and the directory engine. The test speaks to
it over HTTP and reads the database; it can kill -9 the worker or restart Redis (and, given a
PostgreSQL of the test's own in its environment, tests/support/postgres.py, restart that)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import httpx
from celery import Celery

from tests.support.services import ROOT, free_port, port_open, running, service_process, workers_answering

REDIS = ["redis-server", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]


class Stack:
    def __init__(self, env: dict[str, str], log_dir: Path, *, key: str):
        self.redis_port, self.web_port = free_port(), free_port()
        broker = f"redis://127.0.0.1:{self.redis_port}/0"
        # Messages of a killed worker come back after 3 s rather than an hour.
        self.env = {**env, "CELERY_BROKER_URL": broker, "CELERY_VISIBILITY_TIMEOUT": "3"}
        self.log_dir = log_dir
        self.control = Celery(broker=broker, set_as_current=False)
        self.api = httpx.Client(
            base_url=f"http://127.0.0.1:{self.web_port}",
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
        self._services = ExitStack()
        self._redis: ExitStack | None = None
        self._worker: ExitStack | None = None
        self.workers = 0

    def __enter__(self) -> Stack:
        self.start_redis()
        web = [
            sys.executable,
            "-m",
            "lebureau.server",
            "-b",
            "127.0.0.1",
            "-p",
            str(self.web_port),
            "lebureau.asgi:application",
        ]
        # With its connection pool, as the Procfile runs the web process.
        web_env = {**self.env, "DATABASE_POOL_MAX": "4"}
        self._services.enter_context(
            service_process(
                f"stack-web-{self.web_port}", web, web_env, self.log_dir, lambda: port_open(self.web_port)
            )
        )
        self.start_worker()
        return self

    def __exit__(self, *exc) -> None:
        for part in (self._worker, self._services, self._redis):
            if part is not None:
                part.close()
        self.api.close()
        self.control.close()

    def start_redis(self) -> None:
        self._redis = ExitStack()
        self._redis.enter_context(running([*REDIS, "--port", str(self.redis_port)], self.redis_port))

    def restart_redis(self) -> None:
        """What a Redis restart does to a broker that keeps nothing on disk: every queued task is gone."""
        self._redis.close()
        self.start_redis()

    def start_worker(self) -> None:
        self.workers += 1
        node = f"stack-{self.web_port}-{self.workers}"
        args = [sys.executable, "-m", "celery", "-A", "lebureau", "worker", "-l", "INFO", "-c", "2"]
        args += ["-n", f"{node}@%h"]
        self._worker = ExitStack()
        self.worker = self._worker.enter_context(
            service_process(
                node, args, self.env, self.log_dir, lambda: workers_answering(self.control, f"{node}@")
            )
        )

    def kill_worker(self) -> None:
        """kill -9 of the worker and its pool, as a crash of its machine would."""
        os.killpg(self.worker.pid, signal.SIGKILL)
        self.worker.wait()
        self._worker.close()
        self._worker = None

    def manage(self, *args: str) -> str:
        command = [sys.executable, "manage.py", *args]
        return subprocess.run(
            command, cwd=ROOT, env=self.env, check=True, capture_output=True, text=True
        ).stdout
