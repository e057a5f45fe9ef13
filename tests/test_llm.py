"""cudaforge/llm.py: the OpenAI and Anthropic clients against a real loopback server speaking
their wire formats (tests/llm_server.py, scripted FIXTURE replies), retries, keys, cost, and the
providers without an API."""

from __future__ import annotations

import json
import logging
import socket
import threading

import pytest
from llm_server import LLMServer, Scripted

from cudaforge.agents.providers import (
    AnthropicChat,
    OpenAIChat,
    ReplayProvider,
    Reply,
    RetryPolicy,
    ScriptedProvider,
    Usage,
    cost_of,
    get_provider,
    parse_model,
    price_for,
    redact,
    retry_after,
)
from cudaforge.errors import LLMError, NeedsKeyError

OPENAI_KEY = "sk-FIXTURE-openai-0123456789abcdef"
ANTHROPIC_KEY = "sk-ant-FIXTURE-0123456789abcdef"
MESSAGES = [
    {"role": "system", "content": "FIXTURE system prompt"},
    {"role": "user", "content": "FIXTURE question"},
]


@pytest.fixture
def server():
    with LLMServer() as s:
        yield s


@pytest.fixture
def keys(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY)


class Sleeps(list):
    """Records the delays a client asked for instead of sleeping."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def openai(server, model="o3", **kw) -> OpenAIChat:
    return OpenAIChat(model, base_url=server.url + "/v1", api_key=OPENAI_KEY, **kw)


# ---------------------------------------------------------------- wire formats


def test_openai_request_format_and_reply(server):
    server.push_text("FIXTURE answer", input_tokens=1000, output_tokens=500)
    chat = openai(server, params={"reasoning_effort": "high"})
    reply = chat.complete(MESSAGES)
    request = server.requests[-1]
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {OPENAI_KEY}"
    assert request.headers["content-type"] == "application/json"
    assert request.json == {"model": "o3", "messages": MESSAGES, "reasoning_effort": "high"}
    assert reply.text == "FIXTURE answer"
    assert (reply.input_tokens, reply.output_tokens) == (1000, 500)
    assert reply.finish_reason == "stop" and reply.attempts == 1 and reply.model == "o3"
    assert reply.cost_usd == pytest.approx((1000 * 2.0 + 500 * 8.0) / 1e6)  # o3: $2 / $8 per M
    assert chat.usage.calls == 1 and chat.usage.cost_usd == pytest.approx(reply.cost_usd)


def test_anthropic_request_format_and_reply(server):
    server.push_text("FIXTURE answer", input_tokens=2000, output_tokens=100)
    chat = AnthropicChat("claude-sonnet-4-5", base_url=server.url, api_key=ANTHROPIC_KEY)
    reply = chat.complete(MESSAGES)
    request = server.requests[-1]
    assert request.path == "/v1/messages"
    assert request.headers["x-api-key"] == ANTHROPIC_KEY
    assert request.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in request.headers
    body = request.json
    assert body["model"] == "claude-sonnet-4-5"
    assert body["system"] == "FIXTURE system prompt"
    assert body["messages"] == [{"role": "user", "content": "FIXTURE question"}]
    assert body["max_tokens"] > 0
    assert reply.text == "FIXTURE answer" and reply.finish_reason == "end_turn"
    assert reply.cost_usd == pytest.approx((2000 * 3.0 + 100 * 15.0) / 1e6)


def test_anthropic_base_url_with_v1(server):
    server.push_text("FIXTURE")
    AnthropicChat("claude-haiku-4-5", base_url=server.url + "/v1", api_key="x" * 10).complete(
        MESSAGES
    )
    assert server.requests[-1].path == "/v1/messages"


def test_model_string_with_base_url_needs_no_key(server, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    chat = get_provider(f"openai:qwen3-coder@{server.url}/v1")
    assert chat.model_id == f"openai:qwen3-coder@{server.url}/v1"
    server.push_text("FIXTURE local")
    reply = chat.complete(MESSAGES)
    assert reply.text == "FIXTURE local"
    assert "authorization" not in server.requests[-1].headers
    assert reply.cost_usd is None  # not in the price table
    assert chat.usage.unpriced_calls == 1 and chat.usage.cost_usd == 0.0


# ---------------------------------------------------------------- retries and errors


def test_retry_on_429_then_success_honours_retry_after(server):
    server.push_error(429, "FIXTURE rate limited", headers={"Retry-After": "7"})
    server.push_text("FIXTURE after the limit")
    sleeps = Sleeps()
    reply = openai(server, sleep=sleeps).complete(MESSAGES)
    assert reply.text == "FIXTURE after the limit"
    assert reply.attempts == 2 and len(server.requests) == 2
    assert sleeps == [7.0]


def test_5xx_backoff_grows_and_is_bounded(server):
    for _ in range(3):
        server.push_error(503, "FIXTURE unavailable")
    sleeps = Sleeps()
    policy = RetryPolicy(max_retries=2, base_delay=1.0, max_delay=60.0)
    with pytest.raises(LLMError) as info:
        openai(server, retry=policy, sleep=sleeps).complete(MESSAGES)
    assert len(server.requests) == 3  # 1 + max_retries
    assert info.value.status == 503
    assert "FIXTURE unavailable" in str(info.value) and "after 3 attempts" in str(info.value)
    assert 0.5 <= sleeps[0] <= 1.0 and 1.0 <= sleeps[1] <= 2.0


def test_retry_after_forms():
    assert retry_after({"retry-after": "2.5"}) == 2.5
    assert retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0  # in the past
    assert retry_after({"retry-after": "soon"}) is None
    assert retry_after({}) is None


def test_timeout_is_retried_then_reported(server):
    server.push(Scripted(text="FIXTURE late", delay=1.0), Scripted(text="FIXTURE late", delay=1.0))
    sleeps = Sleeps()
    chat = openai(server, timeout=0.15, retry=RetryPolicy(max_retries=1), sleep=sleeps)
    with pytest.raises(LLMError) as info:
        chat.complete(MESSAGES)
    assert len(server.requests) == 2 and len(sleeps) == 1
    assert "after 2 attempt(s)" in str(info.value)
    assert "timed out" in str(info.value).lower() or "timeout" in str(info.value).lower()
    assert info.value.status is None


def test_connection_refused_is_retried():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sleeps = Sleeps()
    chat = OpenAIChat(
        "o3", base_url=f"http://127.0.0.1:{port}/v1", retry=RetryPolicy(max_retries=3), sleep=sleeps
    )
    with pytest.raises(LLMError, match="Couldn't connect"):
        chat.complete(MESSAGES)
    assert len(sleeps) == 3


def test_401_gives_a_clear_error_without_the_key(server, caplog):
    server.push_error(401, f"Incorrect API key provided: {OPENAI_KEY[:12]}****cdef")
    with caplog.at_level(logging.DEBUG), pytest.raises(LLMError) as info:
        openai(server).complete(MESSAGES)
    message = str(info.value)
    assert info.value.status == 401 and len(server.requests) == 1  # not retried
    assert "HTTP 401" in message and "refused" in message and "OPENAI_API_KEY" in message
    assert "Incorrect API key provided" in message
    assert OPENAI_KEY not in message and OPENAI_KEY[:12] not in message
    assert OPENAI_KEY not in caplog.text


def test_400_is_not_retried_and_shows_the_provider_message(server):
    server.push_error(400, "FIXTURE: max_tokens is too large")
    with pytest.raises(LLMError, match="HTTP 400.*max_tokens is too large"):
        openai(server).complete(MESSAGES)
    assert len(server.requests) == 1


def test_malformed_json_reply(server):
    server.push(Scripted(raw=b"{this is not json"))
    with pytest.raises(LLMError, match="not JSON") as info:
        openai(server).complete(MESSAGES)
    assert info.value.status == 200


def test_json_in_the_wrong_shape(server):
    server.push(Scripted(raw=json.dumps({"choices": []}).encode()))
    with pytest.raises(LLMError, match="not in the openai format"):
        openai(server).complete(MESSAGES)
    server.push(Scripted(raw=json.dumps({"id": "x"}).encode()))
    with pytest.raises(LLMError, match="not in the anthropic format"):
        AnthropicChat("claude-sonnet-4-5", base_url=server.url, api_key="k" * 10).complete(MESSAGES)


def test_reply_without_content_is_empty_text(server):
    body = {
        "choices": [{"message": {"role": "assistant", "content": None}, "finish_reason": "length"}]
    }
    server.push(Scripted(raw=json.dumps(body).encode()))
    reply = openai(server).complete(MESSAGES)
    assert reply.text == "" and reply.finish_reason == "length"


def test_concurrent_calls_share_one_provider(server):
    server.push(*(Scripted(text=f"FIXTURE {i}", delay=0.2) for i in range(6)))
    chat = openai(server)
    texts = []

    def call():
        texts.append(chat.complete(MESSAGES).text)

    threads = [threading.Thread(target=call) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(texts) == sorted(f"FIXTURE {i}" for i in range(6))
    assert chat.usage.calls == 6 and chat.usage.input_tokens == 6 * 11


# ---------------------------------------------------------------- keys


def test_missing_key_names_the_variable(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(NeedsKeyError) as info:
        get_provider("openai:o3")
    assert info.value.env_var == "OPENAI_API_KEY" and "OPENAI_API_KEY" in str(info.value)
    with pytest.raises(NeedsKeyError) as info:
        get_provider("anthropic:claude-sonnet-4-5")
    assert info.value.env_var == "ANTHROPIC_API_KEY"


def test_key_from_environment_and_never_in_repr(keys, server):
    chat = get_provider("anthropic:claude-sonnet-4-5")
    assert ANTHROPIC_KEY not in repr(chat) and "ANTHROPIC_API_KEY" in repr(chat)
    assert ANTHROPIC_KEY not in repr(vars(chat).get("usage"))
    explicit = OpenAIChat("o3", api_key="sk-explicit-FIXTURE-000000000000")
    assert "sk-explicit" not in repr(explicit) and "argument" in repr(explicit)


def test_redact_removes_known_and_key_shaped_strings(keys):
    registered = OpenAIChat("o3", api_key="FIXTURE-plain-secret-42")._key
    text = f"a {OPENAI_KEY} b {ANTHROPIC_KEY} c {registered} d sk-proj-abcdefghijklmnopqrstuv e"
    clean = redact(text)
    for secret in (OPENAI_KEY, ANTHROPIC_KEY, registered, "sk-proj-abcdefghijklmnopqrstuv"):
        assert secret not in clean
    assert clean.startswith("a [redacted] b [redacted] c [redacted] d [redacted] e")
    assert (
        redact("mask-abcdefghijklmnopqrstuvwxyz stays") == "mask-abcdefghijklmnopqrstuvwxyz stays"
    )


# ---------------------------------------------------------------- names, prices, usage


def test_parse_model():
    assert parse_model("openai:o3") == ("openai", "o3", None)
    assert parse_model("anthropic:claude-sonnet-4-5") == ("anthropic", "claude-sonnet-4-5", None)
    assert parse_model("openai:qwen3-coder@http://localhost:8000/v1") == (
        "openai",
        "qwen3-coder",
        "http://localhost:8000/v1",
    )
    assert parse_model("openai:qwen2.5-coder:32b@http://localhost:11434/v1")[1] == (
        "qwen2.5-coder:32b"
    )
    assert parse_model("replay:/tmp/a@b.jsonl") == ("replay", "/tmp/a@b.jsonl", None)
    for bad in ("o3", ":o3", "openai:", "openai:@http://x"):
        with pytest.raises(ValueError):
            parse_model(bad)
    with pytest.raises(ValueError, match="unknown provider"):
        get_provider("gemini:pro")


def test_prices_match_snapshots_and_can_be_overridden():
    assert price_for("claude-sonnet-4-5-20250929") == (3.0, 15.0)
    assert price_for("o3-mini") == (1.1, 4.4) and price_for("o3") == (2.0, 8.0)
    assert price_for("qwen3-coder") is None
    assert price_for("qwen3-coder", {"qwen3-coder": (0.0, 0.0)}) == (0.0, 0.0)
    assert cost_of("o3", 1_000_000, 0, {"o3": (1.0, 1.0)}) == pytest.approx(1.0)


def test_usage_sums():
    total = Usage()
    total.add(Reply("a", "m", 10, 5, 0.5))
    total.add(Reply("b", "m", 1, 1, None))
    both = total + total
    assert (both.calls, both.input_tokens, both.output_tokens) == (4, 22, 12)
    assert both.cost_usd == pytest.approx(1.0) and both.unpriced_calls == 2


# ---------------------------------------------------------------- scripted and replay


def test_scripted_provider_answers_in_order():
    boom = LLMError("FIXTURE failure")
    scripted = ScriptedProvider(
        ["one", lambda m: m[-1]["content"].upper(), boom], cost_per_call=0.1
    )
    assert scripted.complete([{"role": "user", "content": "x"}]).text == "one"
    assert scripted.complete([{"role": "user", "content": "shout"}]).text == "SHOUT"
    with pytest.raises(LLMError, match="FIXTURE failure"):
        scripted.complete(MESSAGES)
    with pytest.raises(LLMError, match="no scripted reply left"):
        scripted.complete(MESSAGES)
    assert scripted.usage.calls == 2 and scripted.usage.cost_usd == pytest.approx(0.2)
    assert len(scripted.prompts) == 4
    assert get_provider("scripted:").model_id == "scripted:"


def test_replay_provider_matches_tags_and_role(tmp_path):
    path = tmp_path / "t.jsonl"
    records = [
        {"kind": "start"},
        {"kind": "llm", "role": "coder", "tag": "r1/l0", "reply": "coder r1", "cost_usd": 0.5},
        {"kind": "llm", "role": "judge", "tag": "r2/l0", "reply": "judge r2"},
        {"kind": "llm", "role": "coder", "tag": "r2/l1", "reply": "coder r2 lane 1"},
        {"kind": "llm", "role": "coder", "tag": "r2/l0", "reply": "coder r2 lane 0"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    coder = get_provider(f"replay:{path}", role="coder")
    assert isinstance(coder, ReplayProvider)
    assert coder.complete(MESSAGES, tag="r1/l0").text == "coder r1"
    assert coder.complete(MESSAGES, tag="r2/l0").text == "coder r2 lane 0"
    assert coder.complete(MESSAGES, tag="r2/l1").text == "coder r2 lane 1"
    with pytest.raises(LLMError, match="no more coder replies"):
        coder.complete(MESSAGES, tag="r3/l0")
    assert coder.usage.cost_usd == pytest.approx(0.5)
    judge = ReplayProvider(path, role="judge")
    assert judge.complete(MESSAGES).text == "judge r2" and judge.remaining == 0
    with pytest.raises(LLMError, match="no transcript"):
        ReplayProvider(tmp_path / "missing.jsonl")
