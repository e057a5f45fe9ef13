"""The `file:DIR` provider: a person or another program answers the prompts through files.

Each call writes its whole prompt to `DIR/<run>/<name>.prompt.md` and takes the answer from
`DIR/<run>/<name>.reply.md`, written by whoever plays the role. `<run>` is the problem's name,
cleaned for a file name (`run=`, or `for_run(name)`; `default` without one). The spec takes options after a `?`:
`file:DIR`, `file:DIR?wait=0`, `file:DIR?timeout=600&poll=0.5`.

File names. `<name>` is `<role>-r<round>-l<lane>` from the loop's tag `r<round>/l<lane>`; a tag
with more after the lane (`r3/l0/repair`) adds it as a suffix (`coder-r3-l0-repair`); a tag of
another shape is used as it is, cleaned for a file name, and no tag gives `<role>-call`. When one
provider is asked, in one run, a different prompt under a name it already used (two calls of one
role in the same round and lane), the later call gets `-2`, `-3`, ... in the order asked: names
are distinct, and stable as long as the loop asks in the same order, which is what resume needs.

Prompts and replies. A prompt file holds a short header (role, round, lane, run, model id, the
reply file to write), a `---` line, then every message as a `## message i of n: <role>` section,
verbatim. A prompt file that is already there with the same messages is not written again and its
reply, if any, is used (resume). One with different messages raises LLMError naming it: a reply
to another prompt must not be used. A reply is read once it is complete: non-empty, and its size
and modification time unchanged for one poll interval (a writer that renames a finished file into
place passes at once once the interval has gone by since it was written).

Waiting. By default a call waits for its reply, polling every `poll` seconds, for at most
`timeout` seconds (default: no limit; Ctrl-C interrupts it); on timeout it raises LLMError with the
path it waited for. With `wait=0` it does not wait: a missing reply raises RepliesPending, whose
`.prompt_files` are the prompts still without a reply, so that a run can stop and resume later.

Replies carry the text verbatim. Their token counts are estimates, characters / 4, and say so in
`finish_reason` (ESTIMATED) and `tokens_estimated`; the cost is None (no price).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import LLMError
from .providers import SCHEMES, Messages, Provider, Reply

DEFAULT_POLL = 0.5  # seconds between looks for a reply
DEFAULT_RUN = "default"
ESTIMATED = "file reply; token counts estimated as characters / 4"
PROMPT_SUFFIX = ".prompt.md"
REPLY_SUFFIX = ".reply.md"
_HEADER_END = "\n\n---\n\n"  # the header holds no such line; the messages start after it
_TAG = re.compile(r"^r(\d+)/l(\d+)(?:/(.+))?$")


class RepliesPending(LLMError):
    """Replies are not written yet and the provider does not wait (`wait=0`).
    Attribute: prompt_files, the prompt files (Paths) that still need a reply."""

    def __init__(self, message: str, prompt_files: list[Path], provider: str = ""):
        super().__init__(message, provider)
        self.prompt_files = list(prompt_files)


def _file_word(text: str) -> str:
    """`text` cleaned to letters, digits, '.', '_' and '-' for a file name."""
    return re.sub(r"[^\w.-]+", "-", text).strip("-.") or "x"


def _estimate_tokens(chars: int) -> int:
    return (chars + 3) // 4


def parse_spec(spec: str) -> tuple[str, dict[str, float | bool | None]]:
    """'DIR?wait=0&timeout=5&poll=0.5' (the part after 'file:') -> (DIR, settings).

    settings: wait (bool), timeout (seconds or None), poll (seconds), only those given."""
    directory, _, query = spec.partition("?")
    if not directory:
        raise ValueError(f"file:{spec}: needs a folder, e.g. file:replies or file:replies?wait=0")
    settings: dict[str, float | bool | None] = {}
    for item in filter(None, query.split("&")):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"file:{spec}: option {item!r} has no value (write {item}=...)")
        if key == "wait":
            if value.lower() not in ("0", "1", "false", "true", "no", "yes"):
                raise ValueError(f"file:{spec}: wait={value!r} is not 0 or 1")
            settings["wait"] = value.lower() in ("1", "true", "yes")
        elif key in ("timeout", "poll"):
            try:
                seconds = float(value)
            except ValueError:
                raise ValueError(
                    f"file:{spec}: {key}={value!r} is not a number of seconds"
                ) from None
            if seconds <= 0:
                raise ValueError(f"file:{spec}: {key} must be more than 0 seconds")
            settings[key] = seconds
        else:
            raise ValueError(f"file:{spec}: unknown option {key!r} (known: wait, timeout, poll)")
    return directory, settings


class FileProvider(Provider):
    """Prompts written to files, replies read from files (module docstring).

    directory: the folder DIR. role: 'coder' or 'judge', the first word of each file name (the
    loop makes one provider per role). run: the run's folder under DIR. wait, timeout (s), poll
    (s): as the module docstring says. sleep: how to wait (tests)."""

    needs_key = False

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        role: str | None = None,
        run: str | None = None,
        wait: bool = True,
        timeout: float | None = None,
        poll: float = DEFAULT_POLL,
        sleep: Callable[[float], None] = time.sleep,
    ):
        super().__init__()
        if poll <= 0:
            raise ValueError(f"poll must be more than 0 seconds, not {poll}")
        self.directory = Path(directory)
        self.role = role or "llm"
        self.run = _file_word(run) if run else DEFAULT_RUN
        self.wait = wait
        self.timeout = timeout
        self.poll = poll
        self.model_id = f"file:{directory}"
        self._sleep = sleep
        self._asked: dict[str, str] = {}  # file stem -> the messages asked under it, this run
        self._lock = threading.Lock()

    @classmethod
    def from_spec(cls, spec: str, *, role: str | None = None, **options) -> FileProvider:
        """A provider from the part after 'file:' ('DIR?wait=0&timeout=5'); options (run, wait,
        timeout, poll, sleep) override the spec's."""
        directory, settings = parse_spec(spec)
        return cls(directory, role=role, **{**settings, **options})

    def for_run(self, name: str, role: str | None = None) -> FileProvider:
        """A provider for the run `name` (and `role`, when given): same folder and settings."""
        return type(self)(
            self.directory, role=role or self.role, run=name, wait=self.wait,
            timeout=self.timeout, poll=self.poll, sleep=self._sleep,
        )  # fmt: skip

    @property
    def run_dir(self) -> Path:
        return self.directory / self.run

    def __repr__(self) -> str:
        how = "waits" if self.wait else "wait=0"
        return f"FileProvider({self.model_id!r}, role={self.role!r}, run={self.run!r}, {how})"

    # ------------------------------------------------------------ the call

    def complete(self, messages: Messages, *, tag: str = "") -> Reply:
        started = time.monotonic()
        body = _messages_text(messages)
        stem = self._claim(_stem(self.role, tag), body)
        prompt_path = self.run_dir / f"{stem}{PROMPT_SUFFIX}"
        reply_path = self.run_dir / f"{stem}{REPLY_SUFFIX}"
        self._write_prompt(prompt_path, reply_path, tag, body)
        text = self._await_reply(prompt_path, reply_path)
        reply = Reply(
            text=text,
            model=self.model_id,
            input_tokens=_estimate_tokens(sum(len(m["content"]) for m in messages)),
            output_tokens=_estimate_tokens(len(text)),
            cost_usd=None,
            seconds=time.monotonic() - started,
            finish_reason=ESTIMATED,
            tokens_estimated=True,
        )
        return self._count(reply)

    def _claim(self, base: str, body: str) -> str:
        """The file stem for this call: `base`, or `base-2`, `base-3`, ... when this provider
        already asked different messages under the shorter names in this run."""
        with self._lock:
            number = 1
            while True:
                stem = base if number == 1 else f"{base}-{number}"
                asked = self._asked.get(stem)
                if asked is None or asked == body:
                    self._asked[stem] = body
                    return stem
                number += 1

    def _write_prompt(self, prompt_path: Path, reply_path: Path, tag: str, body: str) -> None:
        """Write the prompt file, or check that the one there asks the same messages."""
        with self._lock:
            if prompt_path.exists():
                existing = prompt_path.read_text("utf-8")
                _, sep, old_body = existing.partition(_HEADER_END)
                if sep and old_body == body:
                    return
                has_reply = " and a reply" if reply_path.exists() else ""
                raise LLMError(
                    f"{self.model_id}: {prompt_path} exists{has_reply} for a different prompt "
                    "than the one asked now (the loop, the prompts or the problem changed): "
                    "its reply would answer another question. Delete it and its reply, or use "
                    "another folder, to ask again.",
                    provider=self.model_id,
                )
            self.run_dir.mkdir(parents=True, exist_ok=True)
            header = _header(self, prompt_path, reply_path, tag)
            _write_atomic(prompt_path, header + _HEADER_END + body)

    def _await_reply(self, prompt_path: Path, reply_path: Path) -> str:
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            text = self._complete_reply(reply_path)
            if text is not None:
                return text
            if not self.wait:
                raise RepliesPending(
                    f"{self.model_id}: no reply yet for {prompt_path} (write {reply_path.name} "
                    "beside it, then run again)",
                    [prompt_path],
                    provider=self.model_id,
                )
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise LLMError(
                        f"{self.model_id}: no complete reply at {reply_path} after "
                        f"{self.timeout:g} s (the prompt is {prompt_path})",
                        provider=self.model_id,
                    )
                self._sleep(min(self.poll, left))
            else:
                self._sleep(self.poll)

    def _complete_reply(self, path: Path) -> str | None:
        """The reply's text once it is complete (module docstring), else None."""
        first = _stat(path)
        if first is None:
            return None
        if time.time() - first[1] / 1e9 < self.poll:  # written moments ago: may still grow
            self._sleep(self.poll)
            if _stat(path) != first:
                return None
        try:
            return path.read_text("utf-8")
        except UnicodeDecodeError as exc:
            raise LLMError(
                f"{self.model_id}: {path} is not UTF-8 text ({exc})", provider=self.model_id
            ) from None
        except FileNotFoundError:
            return None

    def pending_prompts(self) -> list[Path]:
        """The prompt files of this run that have no complete-looking (non-empty) reply yet."""
        if not self.run_dir.is_dir():
            return []
        pending = []
        for prompt in sorted(self.run_dir.glob(f"*{PROMPT_SUFFIX}")):
            reply = prompt.with_name(prompt.name[: -len(PROMPT_SUFFIX)] + REPLY_SUFFIX)
            if _stat(reply) is None:
                pending.append(prompt)
        return pending


def _stem(role: str, tag: str) -> str:
    match = _TAG.match(tag)
    if match is None:
        return f"{_file_word(role)}-{_file_word(tag) if tag else 'call'}"
    stem = f"{_file_word(role)}-r{int(match[1])}-l{int(match[2])}"
    return stem + (f"-{_file_word(match[3])}" if match[3] else "")


def _messages_text(messages: Messages) -> str:
    count = len(messages)
    parts = [
        f"## message {i} of {count}: {m['role']}\n\n{m['content']}\n"
        for i, m in enumerate(messages, 1)
    ]
    return "\n".join(parts)


def _header(provider: FileProvider, prompt_path: Path, reply_path: Path, tag: str) -> str:
    match = _TAG.match(tag)
    round_no, lane = (match[1], match[2]) if match else ("?", "?")
    return "\n".join(
        (
            f"# {provider.role} prompt {prompt_path.name[: -len(PROMPT_SUFFIX)]}",
            "",
            f"- role: {provider.role}",
            f"- round: {round_no}",
            f"- lane: {lane}",
            f"- run: {provider.run}",
            f"- model id: {provider.model_id}",
            (
                f"- reply: the whole answer, as a chat model would give it, in {reply_path.name} "
                "beside this file (write it under another name, then rename it)"
            ),
            "",
            "The messages follow, each verbatim under its own heading.",
        )
    )


def _stat(path: Path) -> tuple[int, int] | None:
    """(size, modification time in ns) of a non-empty file, else None."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_size, st.st_mtime_ns) if st.st_size > 0 else None


def _write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary name, so a reader never sees half a file."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    temporary.write_text(text, "utf-8")
    os.replace(temporary, path)


SCHEMES["file"] = FileProvider.from_spec

__all__ = ["ESTIMATED", "FileProvider", "RepliesPending", "parse_spec"]
