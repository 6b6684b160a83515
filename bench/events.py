"""The workspace's server-sent event stream, the one Mission Control's pages read, as a bench sees it:
when each desktop reached each state, and when each chat answer first grew and was done. Waiting on
it rather than polling the API keeps a bench's own requests off the cores it measures."""

from __future__ import annotations

import contextlib
import json
import threading
import time

import requests


def session_of(user) -> str:
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


class WorkspaceEvents(threading.Thread):
    """Reads the workspace's event stream in the background, noting when each event arrived."""

    def __init__(self, base: str, workspace_id: str, user):
        super().__init__(daemon=True)
        url = f"{base}/events/w/{workspace_id}/"
        # No read timeout: the stream is quiet between events.
        cookies = {"sessionid": session_of(user)}
        self.response = requests.get(url, cookies=cookies, stream=True, timeout=(5, None))
        self.response.raise_for_status()
        self.first: dict[str, float] = {}  # chat message id -> its answer's first piece
        self.done: dict[str, float] = {}  # chat message id -> its answer complete
        self.states: dict[tuple[str, str], float] = {}  # (desktop id, state) -> reached
        self.errors: dict[str, str] = {}  # desktop id -> why it went to error
        self.steps: dict[tuple[str, str], float] = {}  # (desktop id, provision step) -> begun
        self.addresses: dict[str, str] = {}  # desktop id -> its private address, once it has one
        self.start()

    def run(self) -> None:
        # The stream breaks when the bench's daphne stops: the bench is over then.
        with contextlib.suppress(requests.RequestException):
            self._read()

    def _read(self) -> None:
        event = ""
        for line in self.response.iter_lines(decode_unicode=True):
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and event in ("chat", "desktop"):
                self._note(event, json.loads(line.split(":", 1)[1]), time.perf_counter())

    def _note(self, event: str, data: dict, now: float) -> None:
        if event == "chat":
            if data["text"] and data["status"] == "running":
                self.first.setdefault(data["message_id"], now)
            if data["status"] in ("done", "error"):
                self.done.setdefault(data["message_id"], now)
        elif event == "desktop":
            if data["private_ip"]:
                self.addresses[data["desktop_id"]] = data["private_ip"]
            self.states.setdefault((data["desktop_id"], data["state"]), now)
            if data["progress"]:
                self.steps.setdefault((data["desktop_id"], data["progress"]), now)
            if data["state"] == "error":
                self.errors[data["desktop_id"]] = data.get("last_error", "")

    def wait_state(self, desktop_id: str, state: str, timeout: float = 600) -> float:
        """When the desktop reached `state`, once it has; RuntimeError if it went to error instead."""
        deadline = time.perf_counter() + timeout
        while (desktop_id, state) not in self.states:
            if desktop_id in self.errors:
                raise RuntimeError(f"{desktop_id}: {self.errors[desktop_id]}")
            if time.perf_counter() > deadline or not self.is_alive():
                raise RuntimeError(f"{desktop_id} not {state} (the stream closed, or {timeout:.0f} s passed)")
            time.sleep(0.005)
        return self.states[(desktop_id, state)]
