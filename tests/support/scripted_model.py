"""A scripted OpenAI-compatible model server: the stand-in for an LLM, which cannot be reached here.

It is a double, and says so: it answers `POST /v1/chat/completions` (streamed or not) from a
script of replies, in order, and records every request it gets (headers included) so tests can
check what the agent runtime sent, the BYOK key among it. A reply is a text, or a tool call the
agent must run (`exec` with a shell command) before asking again.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Text:
    content: str
    # Seconds between the streamed pieces (one per word), to make a long answer take time.
    pace: float = 0.0


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


@dataclass
class ScriptedModel:
    """The script and what was asked; `replies` are consumed one per request, then `fallback`."""

    replies: deque = field(default_factory=deque)
    fallback: Text = Text("(the script has nothing more to say)")
    requests: list[dict] = field(default_factory=list)
    # Usage reported with each reply, as a real provider would.
    prompt_tokens: int = 120
    completion_tokens: int = 30
    # When set, a request whose bearer key is not among them is refused with 401, as a real
    # provider refuses a wrong key.
    accepted_keys: set[str] | None = None

    def refuses(self, headers: dict) -> bool:
        key = headers.get("authorization", "").removeprefix("Bearer ")
        return self.accepted_keys is not None and key not in self.accepted_keys

    def script(self, *replies: Text | ToolCall) -> None:
        self.replies.extend(replies)

    def next_reply(self) -> Text | ToolCall:
        return self.replies.popleft() if self.replies else self.fallback


class _Handler(BaseHTTPRequestHandler):
    model: ScriptedModel
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet: tests read `requests`, not the console
        pass

    def do_GET(self):
        headers = {name.lower(): value for name, value in self.headers.items()}
        self.model.requests.append({"path": self.path, "headers": headers, "body": None})
        if self.model.refuses(headers):
            return self._refuse()
        if self.path.rstrip("/").endswith("/models"):
            return self._json({"object": "list", "data": [{"id": "scripted", "object": "model"}]})
        self._json({"error": {"message": "not found"}}, status=404)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if not self.path.rstrip("/").endswith("/chat/completions"):
            return self._json({"error": {"message": "not found"}}, status=404)
        headers = {name.lower(): value for name, value in self.headers.items()}
        self.model.requests.append({"path": self.path, "headers": headers, "body": body})
        if self.model.refuses(headers):
            return self._refuse()
        reply = self.model.next_reply()
        if body.get("stream"):
            self._stream(reply, body)
        else:
            self._json(self._completion(reply))

    def _completion(self, reply) -> dict:
        message = {"role": "assistant", "content": reply.content if isinstance(reply, Text) else None}
        if isinstance(reply, ToolCall):
            message["tool_calls"] = [self._tool_call(reply)]
        return {
            "id": "chatcmpl-scripted",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": "scripted",
            "choices": [{"index": 0, "message": message, "finish_reason": self._finish(reply)}],
            "usage": self._usage(),
        }

    def _stream(self, reply, body: dict) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        if isinstance(reply, Text):
            words = reply.content.split(" ")
            for i, word in enumerate(words):
                self._event({"content": word if i == 0 else f" {word}", "role": "assistant"}, None)
                if reply.pace:
                    time.sleep(reply.pace)
        else:
            call = {"index": 0, **self._tool_call(reply)}
            self._event({"role": "assistant", "content": None, "tool_calls": [call]}, None)
        self._event({}, self._finish(reply))
        if (body.get("stream_options") or {}).get("include_usage"):
            self._send({"choices": [], "usage": self._usage()})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _event(self, delta: dict, finish: str | None) -> None:
        self._send({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    def _send(self, chunk: dict) -> None:
        chunk = {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "model": "scripted", **chunk}
        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.flush()

    def _tool_call(self, reply: ToolCall) -> dict:
        call_id = f"call_{len(self.model.requests)}"
        return {
            "id": call_id,
            "type": "function",
            "function": {"name": reply.name, "arguments": json.dumps(reply.arguments)},
        }

    @staticmethod
    def _finish(reply) -> str:
        return "tool_calls" if isinstance(reply, ToolCall) else "stop"

    def _usage(self) -> dict:
        prompt, completion = self.model.prompt_tokens, self.model.completion_tokens
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _refuse(self) -> None:
        # OpenAI's own answer to a wrong key.
        error = {"message": "Incorrect API key provided.", "type": "invalid_request_error"}
        self._json({"error": {**error, "param": None, "code": "invalid_api_key"}}, status=401)

    def _json(self, payload: dict, status: int = 200) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class ScriptedModelServer:
    """Serves a `ScriptedModel` on `host:port` in a thread; use as a context manager."""

    def __init__(self, host: str, port: int, model: ScriptedModel | None = None):
        self.model = model or ScriptedModel()
        handler = type("Handler", (_Handler,), {"model": self.model})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://{host}:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> ScriptedModelServer:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
