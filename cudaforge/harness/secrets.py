"""Secrets: the one registry of secret values, shared by the LLM layer and the harness.

`register_secret` remembers a value (an API key given to a provider); `redact` removes every
registered value, the values of the environment's *_API_KEY variables and anything shaped like a
common API key from a text; `is_secret_name` says whether an environment variable's name marks
it as holding a secret, so that a candidate's process never starts with it.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Any

REDACTED = "[redacted]"

_secrets: set[str] = set()
_secrets_lock = threading.Lock()

# Strings shaped like credentials, e.g. echoed in an error message. Each pattern is long or
# prefixed enough that code, paths and compile logs do not match it.
_KEY_PATTERNS = (
    re.compile(r"\bsk-[A-Za-z0-9_\-*.]{16,}"),  # OpenAI, Anthropic (sk-ant-...), masked sk-...
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}"),  # GitHub tokens
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{30,}"),
    re.compile(r"\bhf_[A-Za-z0-9]{30,}"),  # Hugging Face
    re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),  # Slack
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),  # AWS access key id
    re.compile(r"\bAIza[0-9A-Za-z_\-]{35}"),  # Google API key
)
# the password part of a URL's user information: scheme://user:PASSWORD@host
_URL_PASSWORD = re.compile(r"://[^/\s:@]+:([^/\s@]+)@")

# Parts of a variable's name that mark a secret. KEY and TOKEN count only at the end of a part
# (OPENAI_API_KEY, APIKEY, GH_TOKEN, AUTHTOKEN), so KEYBOARD, KEYMAP and TOKENIZERS_PARALLELISM
# are not secrets; a part such as MONKEY is (a false positive that costs nothing: the variable
# is only left out of a candidate's environment).
_SECRET_ENDINGS = ("KEY", "KEYS", "TOKEN", "TOKENS")
_SECRET_WORDS = ("SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL")


def register_secret(value: str | None) -> None:
    """Remember a secret value so that `redact` removes it from every text it is given
    (values shorter than 8 characters are ignored: they would match ordinary text)."""
    if value and len(value) >= 8:
        with _secrets_lock:
            _secrets.add(value)


def registered_secrets() -> set[str]:
    """The values given to `register_secret`, with the environment's *_API_KEY values."""
    with _secrets_lock:
        values = set(_secrets)
    values.update(v for k, v in os.environ.items() if k.endswith("_API_KEY") and len(v) >= 8)
    return values


def redact(text: str) -> str:
    """`text` without any known secret: the registered values, the values of the environment's
    *_API_KEY variables, anything shaped like an API key (sk-..., ghp_..., hf_..., AKIA...) and
    the password of a URL (`https://user:PASSWORD@host`)."""
    # spans found in the original text, merged where they overlap, so that no secret is cut in
    # two by another's replacement and then missed (a short registered value inside a token)
    spans = []
    for secret in registered_secrets():
        start = text.find(secret)
        while start >= 0:
            spans.append((start, start + len(secret)))
            start = text.find(secret, start + 1)
    for pattern in _KEY_PATTERNS:
        spans += [m.span() for m in pattern.finditer(text)]
    spans += [m.span(1) for m in _URL_PASSWORD.finditer(text)]
    if not spans:
        return text
    pieces, done = [], 0
    for start, end in sorted(spans):
        if start < done:  # overlaps the span before: extend it
            done = max(done, end)
            continue
        pieces += [text[done:start], REDACTED]
        done = end
    return "".join(pieces) + text[done:]


def redact_all(data: Any) -> Any:
    """A copy of `data` (JSON-like: dicts, lists, strings, numbers) with every string, dict keys
    included, passed through `redact`."""
    if isinstance(data, str):
        return redact(data)
    if isinstance(data, dict):
        return {redact_all(k): redact_all(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [redact_all(v) for v in data]
    return data


def is_secret_name(name: str) -> bool:
    """Whether an environment variable named `name` holds a secret: a part of the name (split
    at `_`, `-`, `.`) ends in KEY or TOKEN, or contains SECRET, PASSWORD or CREDENTIAL; case
    does not matter."""
    parts = [p for p in re.split(r"[^A-Z0-9]+", name.upper()) if p]
    return any(p.endswith(_SECRET_ENDINGS) or any(w in p for w in _SECRET_WORDS) for p in parts)


__all__ = [
    "REDACTED",
    "is_secret_name",
    "redact",
    "redact_all",
    "register_secret",
    "registered_secrets",
]
