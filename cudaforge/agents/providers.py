"""Chat with the models behind the Coder and the Judge.

A model is named by a string, `provider:model[@base_url]`:

- `openai:o3`, `openai:qwen3-coder@http://localhost:8000/v1`: any server with OpenAI's
  `/v1/chat/completions` (OpenAI, vLLM, SGLang, Ollama, OpenRouter, ...). Key: OPENAI_API_KEY;
  required for api.openai.com, optional (sent when set) for another base URL.
- `anthropic:claude-sonnet-4-5`: Anthropic's Messages API (`/v1/messages`). Key: ANTHROPIC_API_KEY.
- `scripted:`: replies queued in code (tests, demos); `replay:PATH`: the replies of a transcript,
  in order, without any API.
- `file:DIR`: prompts written to files, replies read from files (cudaforge.agents.file_provider).

Every provider follows one small contract (`Provider`): a model id, whether it needs a key and
from which environment variable, and `complete(messages) -> Reply`. HTTP goes through the C core
(`_core.http_post`, libcurl, GIL released); the retry policy lives here: 429, 408, 5xx and failed
connections are retried with exponential backoff, honouring Retry-After, a bounded number of
times. API keys never appear in reprs, logs, errors or transcripts (`redact`); the registry of
secrets is the harness's (`cudaforge.harness.secrets`), so a key given to a provider is also kept
out of candidates' environments and results.
"""

from __future__ import annotations

import email.utils
import json
import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import _core
from ..errors import HTTPError, LLMError, NeedsKeyError
from ..harness.secrets import redact, register_secret

log = logging.getLogger("cudaforge.agents.providers")

# List prices in USD per million tokens, (input, output), for the models' public API as of late
# 2025. A model matches its exact name or the longest key that starts its name (dated snapshots:
# claude-sonnet-4-5-20250929 -> claude-sonnet-4-5). Override per provider with prices=.
PRICES: dict[str, tuple[float, float]] = {
    "o3": (2.0, 8.0),
    "o3-mini": (1.1, 4.4),
    "o3-pro": (20.0, 80.0),
    "o4-mini": (1.1, 4.4),
    "gpt-4o": (2.5, 10.0),
    "gpt-4o-mini": (0.15, 0.6),
    "gpt-4.1": (2.0, 8.0),
    "gpt-4.1-mini": (0.4, 1.6),
    "gpt-4.1-nano": (0.1, 0.4),
    "gpt-5": (1.25, 10.0),
    "gpt-5-mini": (0.25, 2.0),
    "gpt-5-nano": (0.05, 0.4),
    "claude-opus-4-5": (5.0, 25.0),
    "claude-opus-4-1": (15.0, 75.0),
    "claude-opus-4": (15.0, 75.0),
    "claude-sonnet-4-5": (3.0, 15.0),
    "claude-sonnet-4": (3.0, 15.0),
    "claude-3-7-sonnet": (3.0, 15.0),
    "claude-haiku-4-5": (1.0, 5.0),
    "claude-3-5-haiku": (0.8, 4.0),
}

OPENAI_URL = "https://api.openai.com/v1"
ANTHROPIC_URL = "https://api.anthropic.com"
ANTHROPIC_VERSION = "2023-06-01"

Messages = list[dict[str, str]]  # [{"role": "system" | "user" | "assistant", "content": str}]


# ---------------------------------------------------------------- usage and replies


def price_for(model: str, prices: dict[str, tuple[float, float]] | None = None):
    """(input, output) USD per million tokens for `model`, or None when it has no price."""
    table = {**PRICES, **(prices or {})}
    if model in table:
        return table[model]
    best = max((k for k in table if model.startswith(k)), key=len, default=None)
    return table[best] if best is not None else None


def cost_of(model, input_tokens, output_tokens, prices=None) -> float | None:
    """Cost of one call in USD, or None when the model has no price."""
    price = price_for(model, prices)
    if price is None:
        return None
    return (input_tokens * price[0] + output_tokens * price[1]) / 1e6


@dataclass
class Usage:
    """Tokens and dollars summed over calls. cost_usd counts only priced calls; unpriced_calls
    says how many were not (a local server, a model missing from the price table);
    estimated_calls, how many calls' token counts are estimates (file: replies)."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    unpriced_calls: int = 0
    estimated_calls: int = 0

    def add(self, reply: Reply) -> None:
        self.calls += 1
        self.input_tokens += reply.input_tokens
        self.output_tokens += reply.output_tokens
        self.estimated_calls += reply.tokens_estimated
        if reply.cost_usd is None:
            self.unpriced_calls += 1
        else:
            self.cost_usd += reply.cost_usd

    def __add__(self, other: Usage) -> Usage:
        return Usage(**{k: getattr(self, k) + getattr(other, k) for k in asdict(self)})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Reply:
    """One model answer. seconds: wall time of the call including retries."""

    text: str
    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    seconds: float = 0.0
    finish_reason: str = ""
    attempts: int = 1  # HTTP requests made (1 + retries)
    tokens_estimated: bool = False  # token counts estimated from characters, not reported

    @classmethod
    def from_record(cls, record: dict[str, Any], **fields: Any) -> Reply:
        """The reply of a transcript's `llm` record (replay, resume); fields override."""
        return cls(
            text=record["reply"],
            model=record.get("model", ""),
            input_tokens=int(record.get("input_tokens") or 0),
            output_tokens=int(record.get("output_tokens") or 0),
            cost_usd=record.get("cost_usd"),
            finish_reason=record.get("finish_reason", ""),
            tokens_estimated=bool(record.get("tokens_estimated")),
            **fields,
        )


# ---------------------------------------------------------------- the provider contract


class Provider:
    """The contract every model provider follows.

    model_id: the string that names it ('openai:o3'). needs_key / env_var: whether an API key is
    required and which environment variable holds it. complete(messages, tag=...) -> Reply, safe
    to call from several threads; `tag` names the call site ('r3/l0') for providers that replay.
    usage: totals over every call of this provider object (per run, when it is reused).
    """

    model_id: str = ""
    needs_key: bool = False
    env_var: str | None = None

    def __init__(self) -> None:
        self.usage = Usage()
        self._usage_lock = threading.Lock()

    def complete(self, messages: Messages, *, tag: str = "") -> Reply:
        raise NotImplementedError

    def _count(self, reply: Reply) -> Reply:
        with self._usage_lock:
            self.usage.add(reply)
        return reply

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.model_id!r})"


@dataclass
class RetryPolicy:
    """Retries of one call: 429, 408, 5xx and failed connections (incl. timeouts). Delays in
    seconds: base_delay * 2**retry with jitter, at most max_delay; a server's Retry-After is
    honoured up to max_retry_after."""

    max_retries: int = 5
    base_delay: float = 1.0
    max_delay: float = 60.0
    max_retry_after: float = 300.0

    def backoff(self, retry: int) -> float:
        return min(self.max_delay, self.base_delay * 2**retry) * random.uniform(0.5, 1.0)


def retry_after(headers: dict[str, str]) -> float | None:
    """Seconds a server asked to wait (retry-after-ms, Retry-After seconds or HTTP date)."""
    if "retry-after-ms" in headers:
        try:
            return max(0.0, float(headers["retry-after-ms"]) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _error_message(body: bytes) -> str:
    """The provider's own error message from an error body, else the start of the body."""
    text = body.decode("utf-8", "replace")
    try:
        data = json.loads(text)
        error = data.get("error", data) if isinstance(data, dict) else data
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
    except ValueError:
        pass
    return text[:500] + ("..." if len(text) > 500 else "")


class HTTPChat(Provider):
    """The part shared by the HTTP providers: keys, JSON over _core.http_post, retries, cost.

    timeout / connect_timeout: seconds for one request / its connection. params: extra fields
    merged into every request body (temperature, max_tokens, reasoning_effort, ...)."""

    protocol = ""
    default_url = ""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        api_key_env: str | None = None,
        params: dict[str, Any] | None = None,
        prices: dict[str, tuple[float, float]] | None = None,
        timeout: float = 600.0,
        connect_timeout: float = 10.0,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ):
        super().__init__()
        self.model = model
        self.base_url = (base_url or self.default_url).rstrip("/")
        self.model_id = f"{self.protocol}:{model}" + (f"@{self.base_url}" if base_url else "")
        self.env_var = api_key_env or self.env_var
        self.needs_key = base_url is None  # a self-hosted server usually takes no key
        self._key = api_key or os.environ.get(self.env_var or "") or None
        self._key_source = "argument" if api_key else self.env_var
        if self._key is None and self.needs_key:
            raise NeedsKeyError(
                f"{self.model_id} needs an API key: set {self.env_var} or pass api_key=",
                provider=self.model_id,
                env_var=self.env_var or "",
            )
        register_secret(self._key)
        self.params = dict(params or {})
        self.prices = prices
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.retry = retry or RetryPolicy()
        self._sleep = sleep

    def __repr__(self) -> str:
        key = f"key from {self._key_source}" if self._key else "no key"
        return f"{type(self).__name__}({self.model_id!r}, {key})"

    # subclasses: endpoint, headers, request body, reply parsing
    def _endpoint(self) -> str:
        raise NotImplementedError

    def _headers(self) -> dict[str, str]:
        raise NotImplementedError

    def _payload(self, messages: Messages) -> dict[str, Any]:
        raise NotImplementedError

    def _parse(self, data: Any) -> tuple[str, int, int, str]:
        raise NotImplementedError

    def complete(self, messages: Messages, *, tag: str = "") -> Reply:
        started = time.perf_counter()
        data, attempts = self._post(self._payload(messages))
        try:
            text, tokens_in, tokens_out, finish = self._parse(data)
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            snippet = redact(json.dumps(data)[:300])
            raise LLMError(
                f"{self.model_id}: the reply is not in the {self.protocol} format "
                f"({type(exc).__name__}: {exc}): {snippet}",
                provider=self.model_id,
                status=200,
            ) from None
        reply = Reply(
            text=text,
            model=self.model,
            input_tokens=tokens_in,
            output_tokens=tokens_out,
            cost_usd=cost_of(self.model, tokens_in, tokens_out, self.prices),
            seconds=time.perf_counter() - started,
            finish_reason=finish,
            attempts=attempts,
        )
        return self._count(reply)

    def _post(self, payload: dict[str, Any]) -> tuple[Any, int]:
        """POST JSON with retries. Returns (decoded reply, requests made)."""
        url = self._endpoint()
        body = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json", **self._headers()}
        policy = self.retry
        for attempt in range(policy.max_retries + 1):
            last = attempt == policy.max_retries
            try:
                status, raw, reply_headers = _core.http_post(
                    url, headers, body, self.timeout, self.connect_timeout
                )
            except HTTPError as exc:
                what = redact(str(exc))
                if exc.retryable and not last:
                    delay = policy.backoff(attempt)
                    log.warning(
                        "%s: %s; retry %d in %.1f s", self.model_id, what, attempt + 1, delay
                    )
                    self._sleep(delay)
                    continue
                raise LLMError(
                    f"{self.model_id}: request failed after {attempt + 1} attempt(s): {what}",
                    provider=self.model_id,
                ) from None
            if 200 <= status < 300:
                try:
                    return json.loads(raw), attempt + 1
                except ValueError:
                    snippet = redact(raw[:300].decode("utf-8", "replace"))
                    raise LLMError(
                        f"{self.model_id}: HTTP {status} from {url} but the body is not JSON: "
                        f"{snippet!r}",
                        provider=self.model_id,
                        status=status,
                    ) from None
            message = redact(_error_message(raw))
            if status in (401, 403):
                source = f"the {self._key_source} key" if self._key else "no key (none was set)"
                raise LLMError(
                    f"{self.model_id}: HTTP {status}, the server refused {source} "
                    f"({'set ' + self.env_var if self.env_var else 'pass api_key='} to a valid "
                    f"key): {message}",
                    provider=self.model_id,
                    status=status,
                )
            retryable = status in (408, 409, 429) or status >= 500
            if retryable and not last:
                wait = retry_after(reply_headers)
                delay = (
                    policy.backoff(attempt) if wait is None else min(wait, policy.max_retry_after)
                )
                log.warning(
                    "%s: HTTP %d (%s); retry %d in %.1f s",
                    self.model_id, status, message[:200], attempt + 1, delay,
                )  # fmt: skip
                self._sleep(delay)
                continue
            tries = f" after {attempt + 1} attempts" if attempt else ""
            raise LLMError(
                f"{self.model_id}: HTTP {status} from {url}{tries}: {message}",
                provider=self.model_id,
                status=status,
            )
        raise AssertionError("unreachable")


def _text_of(content: Any) -> str:
    """A message content as text: a string, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if p.get("type", "text") == "text")


class OpenAIChat(HTTPChat):
    """OpenAI-compatible /chat/completions (OpenAI, vLLM, SGLang, Ollama, OpenRouter, ...)."""

    protocol = "openai"
    default_url = OPENAI_URL
    env_var = "OPENAI_API_KEY"

    def _endpoint(self) -> str:
        return self.base_url + "/chat/completions"

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._key}"} if self._key else {}

    def _payload(self, messages: Messages) -> dict[str, Any]:
        return {"model": self.model, "messages": list(messages), **self.params}

    def _parse(self, data: Any) -> tuple[str, int, int, str]:
        choice = data["choices"][0]
        usage = data.get("usage") or {}
        return (
            _text_of(choice["message"].get("content")),
            int(usage.get("prompt_tokens") or 0),
            int(usage.get("completion_tokens") or 0),
            str(choice.get("finish_reason") or ""),
        )


class AnthropicChat(HTTPChat):
    """Anthropic's Messages API; system messages go to the top-level `system` field."""

    protocol = "anthropic"
    default_url = ANTHROPIC_URL
    env_var = "ANTHROPIC_API_KEY"
    max_tokens = 16000  # required by the API; override with params={"max_tokens": ...}

    def _endpoint(self) -> str:
        return self.base_url + ("/messages" if self.base_url.endswith("/v1") else "/v1/messages")

    def _headers(self) -> dict[str, str]:
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        if self._key:
            headers["x-api-key"] = self._key
        return headers

    def _payload(self, messages: Messages) -> dict[str, Any]:
        system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
        turns = [
            {"role": m["role"], "content": m["content"]} for m in messages if m["role"] != "system"
        ]
        payload: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens}
        if system:
            payload["system"] = system
        payload["messages"] = turns
        payload.update(self.params)
        return payload

    def _parse(self, data: Any) -> tuple[str, int, int, str]:
        if data.get("type") == "error":
            raise KeyError("content")
        usage = data.get("usage") or {}
        tokens_in = sum(
            int(usage.get(k) or 0)
            for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        )
        return (
            _text_of(data["content"]),
            tokens_in,
            int(usage.get("output_tokens") or 0),
            str(data.get("stop_reason") or ""),
        )


# ---------------------------------------------------------------- providers without an API


class ScriptedProvider(Provider):
    """Replies queued in code, answered in order (tests, demos). An item is a str, a Reply, an
    Exception (raised) or a callable(messages) -> str. Token counts of str replies are estimated
    at 4 characters a token; every call costs cost_per_call USD. `prompts` records each call's
    messages. Running out of replies raises LLMError."""

    def __init__(
        self, replies: Iterable[Any] = (), *, model: str = "scripted", cost_per_call: float = 0.0
    ):
        super().__init__()
        self.model = model
        self.model_id = f"scripted:{model}" if model != "scripted" else "scripted:"
        self.cost_per_call = cost_per_call
        self.prompts: list[Messages] = []
        self._queue: deque[Any] = deque(replies)
        self._lock = threading.Lock()

    def push(self, *replies: Any) -> None:
        with self._lock:
            self._queue.extend(replies)

    @property
    def remaining(self) -> int:
        return len(self._queue)

    def complete(self, messages: Messages, *, tag: str = "") -> Reply:
        with self._lock:
            self.prompts.append(list(messages))
            if not self._queue:
                raise LLMError(f"{self.model_id}: no scripted reply left", provider=self.model_id)
            item = self._queue.popleft()
        if isinstance(item, BaseException):
            raise item
        if callable(item):
            item = item(messages)
        if not isinstance(item, Reply):
            prompt_chars = sum(len(m["content"]) for m in messages)
            item = Reply(
                text=str(item),
                model=self.model,
                input_tokens=prompt_chars // 4,
                output_tokens=len(str(item)) // 4,
                cost_usd=self.cost_per_call,
            )
        return self._count(item)


class ReplayProvider(Provider):
    """The replies of one role ('coder' or 'judge') from a transcript written by the loop.

    A call tagged like a recorded call gets that call's reply; calls without tags are answered in
    the recorded order. Recorded token counts and costs are reported again, so that a dollar
    budget stops a replay where it stopped the original run."""

    def __init__(self, path: str | os.PathLike, role: str | None = None):
        super().__init__()
        self.path = Path(path)
        self.role = role
        self.model_id = f"replay:{self.path}"
        if not self.path.exists():
            raise LLMError(f"replay: no transcript at {self.path}", provider=self.model_id)
        records = []
        with open(self.path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    raise LLMError(
                        f"replay: {self.path}:{number} is not a JSON line", provider=self.model_id
                    ) from None
                if record.get("kind") == "llm" and role in (None, record.get("role")):
                    records.append(record)
        self._records = records
        self._used = [False] * len(records)
        self._lock = threading.Lock()

    @property
    def remaining(self) -> int:
        return self._used.count(False)

    def complete(self, messages: Messages, *, tag: str = "") -> Reply:
        with self._lock:
            index = next(
                (
                    i
                    for i, r in enumerate(self._records)
                    if not self._used[i] and (not tag or not r.get("tag") or r["tag"] == tag)
                ),
                None,
            )
            if index is None:
                who = f"{self.role} " if self.role else ""
                where = f" for {tag}" if tag else ""
                raise LLMError(
                    f"replay: {self.path} has no more {who}replies{where}", provider=self.model_id
                )
            self._used[index] = True
        return self._count(Reply.from_record(self._records[index]))


# ---------------------------------------------------------------- model strings

# Schemes whose provider lives in a module of its own, which adds itself here when imported
# (cudaforge.agents imports them all): 'file' -> file_provider.FileProvider.from_spec.
SCHEMES: dict[str, Callable[..., Provider]] = {}


def parse_model(spec: str) -> tuple[str, str, str | None]:
    """'openai:qwen3-coder@http://localhost:8000/v1' -> ('openai', 'qwen3-coder', base_url)."""
    provider, sep, rest = spec.partition(":")
    if not sep or not provider:
        raise ValueError(
            f"model {spec!r} names no provider: write it as openai:MODEL, anthropic:MODEL, "
            "openai:MODEL@BASE_URL, scripted:, replay:PATH or file:DIR"
        )
    if provider in ("replay", "scripted", "file"):
        return provider, rest, None
    model, at, base_url = rest.partition("@")
    if not model:
        raise ValueError(f"model {spec!r}: the model name after '{provider}:' is empty")
    return provider, model, (base_url or None) if at else None


def get_provider(spec: str | Provider, *, role: str | None = None, **options) -> Provider:
    """A provider from a model string (module docstring), or `spec` itself if it is one.

    role: 'coder' or 'judge', used by replay:PATH to pick that role's replies. options go to the
    provider's constructor (api_key, api_key_env, params, prices, timeout, retry, ...). Raises
    NeedsKeyError when the key is missing."""
    if isinstance(spec, Provider):
        return spec
    provider, model, base_url = parse_model(spec)
    if provider == "openai":
        return OpenAIChat(model, base_url=base_url, **options)
    if provider == "anthropic":
        return AnthropicChat(model, base_url=base_url, **options)
    if provider == "scripted":
        return ScriptedProvider(model=model or "scripted", **options)
    if provider == "replay":
        if not model:
            raise ValueError("replay: needs a transcript path, e.g. replay:runs/add.jsonl")
        return ReplayProvider(model, role=role)
    if provider in SCHEMES:
        return SCHEMES[provider](model, role=role, **options)
    raise ValueError(
        f"model {spec!r}: unknown provider {provider!r} (known: openai, anthropic, scripted, "
        "replay, file)"
    )


__all__ = [
    "PRICES",
    "AnthropicChat",
    "OpenAIChat",
    "Provider",
    "ReplayProvider",
    "Reply",
    "RetryPolicy",
    "ScriptedProvider",
    "Usage",
    "cost_of",
    "get_provider",
    "parse_model",
    "price_for",
    "redact",
    "register_secret",
]
