"""TEST FIXTURE: a real HTTP server on 127.0.0.1 (a random free port) that speaks the wire
formats of OpenAI's /v1/chat/completions and Anthropic's /v1/messages and answers with replies
scripted by the tests.

Nothing it serves comes from a language model: every reply text is written by the tests, and the
default reply says FIXTURE. It records each request (path, headers, JSON body) so that tests can
check what the client sent.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DEFAULT_TEXT = "FIXTURE: default scripted reply of tests/llm_server.py"


@dataclass
class Request:
    """One request the server received; header names are lower-case."""

    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self):
        return json.loads(self.body)


@dataclass
class Scripted:
    """One scripted answer. With `text`, the body is a well-formed reply in the wire format of
    the requested path (OpenAI or Anthropic); `{auth}` in the text is replaced by the API key the
    request carried (to test that transcripts redact it). Otherwise `raw` is sent as the body."""

    status: int = 200
    text: str | None = None
    raw: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds to wait before answering
    input_tokens: int = 11
    output_tokens: int = 7


def openai_body(text: str, model: str, input_tokens: int, output_tokens: int) -> dict:
    return {
        "id": "chatcmpl-fixture",
        "object": "chat.completion",
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": input_tokens,
            "completion_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
        },
    }


def anthropic_body(text: str, model: str, input_tokens: int, output_tokens: int) -> dict:
    return {
        "id": "msg_fixture",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 64  # the default 5 drops connections of the concurrency test


class LLMServer:
    """Start with `with LLMServer() as server:`; `server.url` is the base URL (no /v1)."""

    def __init__(self):
        self.requests: list[Request] = []
        self._script: deque[Scripted] = deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ scripting

    def push(self, *answers: Scripted) -> None:
        with self._lock:
            self._script.extend(answers)

    def push_text(self, *texts: str, **kwargs) -> None:
        self.push(*(Scripted(text=t, **kwargs) for t in texts))

    def push_error(self, status: int, message: str, headers=None, delay: float = 0.0) -> None:
        """An error body shaped like both providers' ({"error": {"message": ...}})."""
        body = json.dumps({"type": "error", "error": {"type": "fixture", "message": message}})
        self.push(Scripted(status=status, raw=body.encode(), headers=headers or {}, delay=delay))

    def _next(self) -> Scripted:
        with self._lock:
            return self._script.popleft() if self._script else Scripted(text=DEFAULT_TEXT)

    @property
    def url(self) -> str:
        assert self._httpd is not None
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    # ------------------------------------------------------------ life cycle

    def __enter__(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                with server._lock:
                    server.requests.append(Request(self.path, headers, body))
                answer = server._next()
                if answer.delay and server._stopping.wait(answer.delay):
                    return
                if answer.text is not None:
                    key = headers.get("x-api-key") or headers.get("authorization", "")
                    text = answer.text.replace("{auth}", key.removeprefix("Bearer "))
                    try:
                        model = json.loads(body).get("model", "")
                    except ValueError:
                        model = ""
                    make = anthropic_body if self.path.endswith("/messages") else openai_body
                    data = json.dumps(
                        make(text, model, answer.input_tokens, answer.output_tokens)
                    ).encode()
                else:
                    data = answer.raw or b""
                try:
                    self.send_response(answer.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for name, value in answer.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout tests)

        self._httpd = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stopping.set()
        assert self._httpd is not None and self._thread is not None
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
