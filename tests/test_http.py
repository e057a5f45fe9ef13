"""csrc/http.c: _core.http_post against a real HTTP server on loopback (tests/llm_server.py)."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time

import pytest
from llm_server import LLMServer, Scripted

from cudaforge import _core
from cudaforge.errors import CudaforgeError, HTTPError


@pytest.fixture
def server():
    with LLMServer() as s:
        yield s


def closed_port() -> int:
    """A loopback port that nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_post_sends_body_and_headers_and_returns_status_body_headers(server):
    server.push(Scripted(status=201, raw=b'{"ok": true}', headers={"X-Fixture": "yes"}))
    status, body, headers = _core.http_post(
        server.url + "/v1/chat/completions",
        {"Content-Type": "application/json", "Authorization": "Bearer FIXTURE-KEY"},
        b'{"model": "m"}',
        5.0,
    )
    assert status == 201
    assert json.loads(body) == {"ok": True}
    assert headers["x-fixture"] == "yes"
    assert headers["content-type"] == "application/json"
    request = server.requests[-1]
    assert request.path == "/v1/chat/completions"
    assert request.body == b'{"model": "m"}'
    assert request.headers["authorization"] == "Bearer FIXTURE-KEY"
    assert request.headers["content-type"] == "application/json"
    assert "expect" not in request.headers


def test_headers_as_list_and_str_body(server):
    _core.http_post(
        server.url + "/x", ["A: 1", ("B", "two")], "caf\u00e9", 5.0, connect_timeout=2.0
    )
    request = server.requests[-1]
    assert request.headers["a"] == "1" and request.headers["b"] == "two"
    assert request.body == "caf\u00e9".encode()


def test_error_statuses_are_returned_not_raised(server):
    server.push_error(503, "FIXTURE overloaded", headers={"Retry-After": "3"})
    status, body, headers = _core.http_post(server.url + "/x", {}, b"{}", 5.0)
    assert status == 503
    assert json.loads(body)["error"]["message"] == "FIXTURE overloaded"
    assert headers["retry-after"] == "3"


def test_large_body_is_sent_without_an_expect_round_trip(server):
    payload = b"x" * 300_000
    started = time.perf_counter()
    _core.http_post(server.url + "/x", {}, payload, 5.0)
    assert time.perf_counter() - started < 0.5
    assert server.requests[-1].body == payload


def test_timeout_raises_retryable_http_error(server):
    server.push(Scripted(text="FIXTURE late", delay=1.5))
    started = time.perf_counter()
    with pytest.raises(HTTPError) as info:
        _core.http_post(server.url + "/v1/chat/completions", {}, b"{}", 0.2)
    assert time.perf_counter() - started < 1.0
    err = info.value
    assert err.status is None and err.retryable is True and err.body == ""
    assert "timed out" in str(err).lower() or "timeout" in str(err).lower()
    assert server.url in str(err) and err.url.startswith(server.url)
    assert isinstance(err, CudaforgeError) and isinstance(err, OSError)


def test_refused_connection_is_retryable():
    url = f"http://127.0.0.1:{closed_port()}/v1/messages"
    with pytest.raises(HTTPError) as info:
        _core.http_post(url, {}, b"{}", 2.0, 1.0)
    assert info.value.retryable is True and info.value.status is None
    assert info.value.curl_code == 7  # CURLE_COULDNT_CONNECT
    assert url in str(info.value)


def test_other_protocols_are_refused_and_not_retryable():
    with pytest.raises(HTTPError) as info:
        _core.http_post("file:///etc/passwd", {}, b"", 2.0)
    assert info.value.retryable is False


@pytest.mark.parametrize(
    "args, error",
    [
        (("http://127.0.0.1:1/", {"A": "1\r\nInjected: yes"}, b"", 1.0), ValueError),
        (("http://127.0.0.1:1/", {"A": 1}, b"", 1.0), TypeError),
        (("http://127.0.0.1:1/", [42], b"", 1.0), TypeError),
        (("http://127.0.0.1:1/", 7, b"", 1.0), TypeError),
        (("http://127.0.0.1:1/", {}, 3, 1.0), TypeError),
        (("http://127.0.0.1:1/", {}, b"", 0.0), ValueError),
        (("http://127.0.0.1:1/", {}, b"", float("nan")), ValueError),
        (("http://127.0.0.1:1/", {}, b"", 1.0, -1.0), ValueError),
    ],
)
def test_bad_arguments_are_refused_before_any_request(args, error):
    with pytest.raises(error):
        _core.http_post(*args)


def test_concurrent_requests_from_threads_overlap(server):
    threads_n, delay = 8, 0.4
    server.push(*(Scripted(text="FIXTURE for {auth}", delay=delay) for _ in range(threads_n)))
    replies: dict[int, str] = {}

    def post(i: int) -> None:
        _, body, _ = _core.http_post(
            server.url + "/v1/chat/completions", {"Authorization": f"Bearer thread-{i}"}, b"{}", 5.0
        )
        replies[i] = json.loads(body)["choices"][0]["message"]["content"]

    threads = [threading.Thread(target=post, args=(i,)) for i in range(threads_n)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    # one after the other would take threads_n * delay = 3.2 s: the GIL is released meanwhile
    assert elapsed < threads_n * delay / 2
    assert replies == {i: f"FIXTURE for thread-{i}" for i in range(threads_n)}


def test_a_signal_interrupts_a_blocked_request(server):
    server.push(Scripted(text="FIXTURE never read", delay=1.5))

    class Interrupted(Exception):
        pass

    def handler(signum, frame):
        raise Interrupted

    old = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        started = time.perf_counter()
        with pytest.raises(Interrupted):
            _core.http_post(server.url + "/x", {}, b"{}", 10.0)
        assert time.perf_counter() - started < 1.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
