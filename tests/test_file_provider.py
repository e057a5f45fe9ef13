"""cudaforge/agents/file_provider.py: the file:DIR provider. Prompts go to files, replies come from
files that the tests write the way a responder should (a temporary name, then a rename)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from cudaforge.agents.file_provider import ESTIMATED, FileProvider, RepliesPending, parse_spec
from cudaforge.agents.providers import Provider, get_provider, parse_model
from cudaforge.errors import LLMError

POLL = 0.02
ASK = [
    {"role": "system", "content": "You are the Coder."},
    {"role": "user", "content": "Write ModelNew.\n## not a heading of ours\n```python\nx = 1\n```"},
]


def write_reply(path: Path, text: str) -> None:
    """Write a reply as a responder should: under a temporary name, then renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".partial")
    temporary.write_text(text, "utf-8")
    os.replace(temporary, path)


def provider(tmp_path: Path, **options) -> FileProvider:
    options.setdefault("poll", POLL)
    return FileProvider(tmp_path, role="coder", run="19_ReLU", **options)


def test_waits_for_a_reply_written_by_another_thread(tmp_path):
    p = provider(tmp_path, timeout=30)
    prompt = tmp_path / "19_ReLU" / "coder-r3-l1.prompt.md"
    reply = prompt.with_name("coder-r3-l1.reply.md")

    def responder():
        deadline = time.monotonic() + 20
        while not prompt.exists() and time.monotonic() < deadline:
            time.sleep(POLL)
        write_reply(reply, "Here it is.\n```python\nclass ModelNew: pass\n```\n")

    thread = threading.Thread(target=responder)
    thread.start()
    got = p.complete(ASK, tag="r3/l1")
    thread.join()
    assert got.text == "Here it is.\n```python\nclass ModelNew: pass\n```\n"  # verbatim
    assert got.cost_usd is None and got.finish_reason == ESTIMATED
    assert got.input_tokens == (sum(len(m["content"]) for m in ASK) + 3) // 4
    assert got.output_tokens == (len(got.text) + 3) // 4
    assert p.usage.calls == 1 and p.usage.unpriced_calls == 1
    text = prompt.read_text("utf-8")
    for line in ("- role: coder", "- round: 3", "- lane: 1", "- run: 19_ReLU", "- model id: file:"):
        assert line in text
    for i, message in enumerate(ASK, 1):
        assert f"## message {i} of 2: {message['role']}\n\n{message['content']}\n" in text


def test_wait_0_raises_replies_pending_then_uses_the_reply(tmp_path):
    p = provider(tmp_path, wait=False)
    with pytest.raises(RepliesPending) as caught:
        p.complete(ASK, tag="r1/l0")
    prompt = tmp_path / "19_ReLU" / "coder-r1-l0.prompt.md"
    assert caught.value.prompt_files == [prompt] and prompt.exists()
    assert isinstance(caught.value, LLMError) and str(prompt) in str(caught.value)
    assert p.pending_prompts() == [prompt]
    write_reply(prompt.with_name("coder-r1-l0.reply.md"), "done")
    # the same run again (a resume: a new provider object) takes the reply
    again = provider(tmp_path, wait=False)
    assert again.complete(ASK, tag="r1/l0").text == "done"
    assert again.pending_prompts() == []


def test_an_empty_reply_is_not_complete(tmp_path):
    p = provider(tmp_path, wait=False)
    with pytest.raises(RepliesPending):
        p.complete(ASK, tag="r1/l0")
    (tmp_path / "19_ReLU" / "coder-r1-l0.reply.md").write_text("")
    with pytest.raises(RepliesPending):
        p.complete(ASK, tag="r1/l0")


def test_the_same_prompt_again_reuses_the_reply_without_a_new_prompt_file(tmp_path):
    p = provider(tmp_path, wait=False)
    with pytest.raises(RepliesPending):
        p.complete(ASK, tag="r2/l0")
    run_dir = tmp_path / "19_ReLU"
    write_reply(run_dir / "coder-r2-l0.reply.md", "the answer")
    before = sorted(run_dir.iterdir())
    stamp = (run_dir / "coder-r2-l0.prompt.md").stat().st_mtime_ns
    for asker in (p, provider(tmp_path, wait=False)):
        assert asker.complete(ASK, tag="r2/l0").text == "the answer"
    assert sorted(run_dir.iterdir()) == before
    assert (run_dir / "coder-r2-l0.prompt.md").stat().st_mtime_ns == stamp


def test_a_changed_prompt_with_an_existing_reply_raises(tmp_path):
    first = provider(tmp_path)
    write_reply(tmp_path / "19_ReLU" / "coder-r1-l0.reply.md", "an answer to the old prompt")
    assert first.complete(ASK, tag="r1/l0").text == "an answer to the old prompt"
    changed = [*ASK[:-1], {"role": "user", "content": "Write a different ModelNew."}]
    with pytest.raises(LLMError, match="coder-r1-l0.prompt.md") as caught:
        provider(tmp_path).complete(changed, tag="r1/l0")
    assert not isinstance(caught.value, RepliesPending)


def test_a_second_different_call_in_one_round_and_lane_gets_its_own_files(tmp_path):
    p = provider(tmp_path, wait=False)
    run_dir = tmp_path / "19_ReLU"
    with pytest.raises(RepliesPending):
        p.complete(ASK, tag="r4/l0")
    other = [{"role": "user", "content": "Now the format only."}]
    with pytest.raises(RepliesPending) as caught:
        p.complete(other, tag="r4/l0")
    assert caught.value.prompt_files == [run_dir / "coder-r4-l0-2.prompt.md"]
    with pytest.raises(RepliesPending) as caught:
        p.complete(other, tag="r4/l0/repair")  # a step in the tag names the file
    assert caught.value.prompt_files == [run_dir / "coder-r4-l0-repair.prompt.md"]
    with pytest.raises(RepliesPending) as caught:
        p.complete(other, tag="")
    assert caught.value.prompt_files == [run_dir / "coder-call.prompt.md"]


def test_timeout_raises_llm_error_with_the_path(tmp_path):
    p = provider(tmp_path, timeout=0.1)
    started = time.monotonic()
    with pytest.raises(LLMError, match="coder-r1-l0.reply.md") as caught:
        p.complete(ASK, tag="r1/l0")
    assert not isinstance(caught.value, RepliesPending)
    assert time.monotonic() - started < 5


def test_ctrl_c_while_waiting_propagates(tmp_path):
    def interrupt(seconds):
        raise KeyboardInterrupt

    p = provider(tmp_path, sleep=interrupt)
    with pytest.raises(KeyboardInterrupt):
        p.complete(ASK, tag="r1/l0")


def test_lanes_in_threads_wait_side_by_side(tmp_path):
    p = provider(tmp_path, timeout=30)
    results = {}

    def lane(index):
        results[index] = p.complete(ASK[-1:] + [{"role": "user", "content": str(index)}],
                                    tag=f"r1/l{index}").text  # fmt: skip

    threads = [threading.Thread(target=lane, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    run_dir = tmp_path / "19_ReLU"
    deadline = time.monotonic() + 20
    while len(list(run_dir.glob("*.prompt.md"))) < 3 and time.monotonic() < deadline:
        time.sleep(POLL)
    for i in range(3):
        write_reply(run_dir / f"coder-r1-l{i}.reply.md", f"reply {i}")
    for t in threads:
        t.join()
    assert results == {0: "reply 0", 1: "reply 1", 2: "reply 2"} and p.usage.calls == 3


def test_get_provider_parses_the_spec(tmp_path):
    p = get_provider(f"file:{tmp_path}?wait=0&timeout=5", role="coder")
    assert isinstance(p, FileProvider) and isinstance(p, Provider)
    assert (p.wait, p.timeout, p.poll, p.role, p.run) == (False, 5.0, 0.5, "coder", "default")
    assert p.directory == tmp_path and p.model_id == f"file:{tmp_path}" and not p.needs_key
    assert parse_model("file:runs/a@b?wait=0") == ("file", "runs/a@b?wait=0", None)
    waits = get_provider("file:replies?timeout=600&poll=0.25", role="judge")
    assert (waits.wait, waits.timeout, waits.poll, waits.role) == (True, 600.0, 0.25, "judge")
    assert get_provider("file:replies").timeout is None
    relu = waits.for_run("19_ReLU")
    assert (relu.run, relu.role, relu.poll, relu.timeout, relu.directory) == (
        "19_ReLU", "judge", 0.25, 600.0, Path("replies"),
    )  # fmt: skip
    assert relu.for_run("x", role="coder").role == "coder"
    assert parse_spec("d?wait=1") == ("d", {"wait": True})
    for bad in ("file:", "file:d?wait=maybe", "file:d?poll=0", "file:d?speed=2", "file:d?wait"):
        with pytest.raises(ValueError):
            get_provider(bad)
