"""The Coder's and the Judge's words: the prompt templates (shipped in cudaforge.prompts, each
overridable by a file of the same name), and what the loop reads in a reply: the candidate source
in its code blocks, and the Judge's stop verdict."""

from __future__ import annotations

import ast
import importlib.resources
import os
import re
import textwrap
from pathlib import Path

STOP_MARKER = "VERDICT: STOP"
PROMPT_NAMES = (
    "coder_first",
    "coder_repair",
    "coder_optimize",
    "judge_repair",
    "judge_optimize",
    "judge_rules",
    "contract",
)
NO_CODE_ERROR = (
    "the reply contained no ```python code block defining `class ModelNew`, so nothing could be "
    "compiled or checked"
)
NO_CODE_ADVICE = (
    "Your previous reply had no ```python code block defining `class ModelNew`. Reply with the "
    "complete source file, all of it, in one ```python block."
)


def _shipped_prompt(name: str) -> str:
    try:
        return (importlib.resources.files("cudaforge.prompts") / f"{name}.txt").read_text("utf-8")
    except ModuleNotFoundError:  # running from a source tree that is not installed
        return (Path(__file__).resolve().parents[2] / "prompts" / f"{name}.txt").read_text("utf-8")


class Prompts:
    """The prompt templates: the files shipped in cudaforge.prompts, each replaced by a file of
    the same name in `folder` (or $CUDAFORGE_PROMPTS) where one exists.

    Templates are plain text; `{name}` is replaced by the value of that name, and any other brace
    (CUDA code in a user's template) is left alone."""

    _PLACEHOLDER = re.compile(r"\{(\w+)\}")

    def __init__(self, folder: str | os.PathLike | None = None):
        folder = folder if folder is not None else os.environ.get("CUDAFORGE_PROMPTS") or None
        self.folder = Path(folder) if folder is not None else None
        if self.folder is not None and not self.folder.is_dir():
            raise FileNotFoundError(f"prompts folder {self.folder} does not exist")
        self._texts: dict[str, str] = {}

    def text(self, name: str) -> str:
        if name not in self._texts:
            override = self.folder / f"{name}.txt" if self.folder is not None else None
            if override is not None and override.is_file():
                self._texts[name] = override.read_text("utf-8")
            else:
                self._texts[name] = _shipped_prompt(name)
        return self._texts[name]

    def render(self, name: str, **values: str) -> str:
        def fill(match: re.Match) -> str:
            return values[match[1]] if match[1] in values else match[0]

        return self._PLACEHOLDER.sub(fill, self.text(name))


# ---------------------------------------------------------------- reading replies


def code_blocks(text: str) -> list[tuple[str, str]]:
    """The fenced blocks of a Markdown reply as (language, code); a block the reply leaves open
    (cut off) runs to the end."""
    opening = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([^\s`~]*)[^`]*$")
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        match = opening.match(lines[i])
        i += 1
        if match is None:
            continue
        fence, body = match[1], []
        while i < len(lines):
            stripped = lines[i].strip()
            i += 1
            if len(stripped) >= len(fence) and set(stripped) == {fence[0]}:
                break
            body.append(lines[i - 1])
        blocks.append((match[2].lower(), textwrap.dedent("\n".join(body))))
    return blocks


_MODEL_NEW = re.compile(r"^[ \t]*class[ \t]+ModelNew\b", re.MULTILINE)


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    return True


def extract_code(text: str) -> str | None:
    """The candidate source in a Coder reply, or None when there is none.

    Of several code blocks, the last one defining `class ModelNew` that parses as Python wins (a
    reply often shows a broken version before the fixed one), else the last defining it. A reply
    without fences that is itself Python defining ModelNew (possibly after prose) is taken as is.
    """
    defining = [code for _, code in code_blocks(text) if _MODEL_NEW.search(code)]
    if defining:
        parsing = [code for code in defining if _parses(code)]
        return (parsing or defining)[-1].strip() + "\n"
    if "```" in text or "~~~" in text or not _MODEL_NEW.search(text):
        return None
    start = re.search(r"^(import|from)[ \t]", text, re.MULTILINE)
    for source in (text, text[start.start() :] if start else ""):
        if source and _MODEL_NEW.search(source) and _parses(source):
            return source.strip() + "\n"
    return None


def says_stop(judge_text: str) -> bool:
    """True when the Judge's answer has the line `VERDICT: STOP` (any case, any spacing)."""
    verdicts = re.findall(
        r"^[ \t*#>]*VERDICT[ \t*]*:[ \t*]*(\w+)", judge_text, re.MULTILINE | re.IGNORECASE
    )
    return bool(verdicts) and verdicts[-1].upper() == "STOP"


__all__ = [
    "NO_CODE_ADVICE",
    "NO_CODE_ERROR",
    "PROMPT_NAMES",
    "STOP_MARKER",
    "Prompts",
    "code_blocks",
    "extract_code",
    "says_stop",
]
