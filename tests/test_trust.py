"""The trust boundary on the CPU path (issue 17): a candidate cannot buy its verdict by patching the
harness, cannot poison the next verdict, sees no secrets, no network and no home directory,
leaves no process behind, and cannot forge its result.

Each test was checked to fail without its protection (see the comment in each): the patching
candidate by a control run in-process (the old flow), the others by running them against the
warm-worker pool of main before this change, or by reasoning about which assertion the removed
code guards."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from test_worker import FAST, RELU  # the same small ReLU problem and fast options

from cudaforge.harness.pool import WorkerPool
from cudaforge.harness.secrets import register_secret

# Replaces the harness's checking functions wherever it finds them (module functions and the
# evaluation's tampering check), then returns zeros: against checks made in its own process
# this is "ok" (the control below shows it).
PATCHER = """
import sys
import torch

def no_difference(*args, **kwargs):
    return None

def nothing_changed(*args, **kwargs):
    return []

def no_tampering(self, when):
    return None

for name, module in list(sys.modules.items()):
    if name.startswith("cudaforge") and module is not None:
        for attr in ("check_outputs", "compare_tensors", "changed_input"):
            if hasattr(module, attr):
                setattr(module, attr, no_difference)
        if hasattr(module, "_fingerprint_diff"):
            module._fingerprint_diff = nothing_changed
sys.modules["cudaforge.harness.evaluation"].Evaluation.check_tampering = no_tampering

class ModelNew(torch.nn.Module):
    def forward(self, x):
        return torch.zeros_like(x)
"""

# the same, and it also answers every comparison itself ("passed") without asking anyone
PATCHER_OF_THE_JUDGE = PATCHER.replace(
    "class ModelNew",
    """from cudaforge.harness.reference import Judgement
for name in ("cudaforge.harness.host_copy", "cudaforge.harness.reference"):
    module = sys.modules.get(name)
    for cls in ("RemoteJudge", "ReferenceJudge"):
        if module is not None and hasattr(module, cls):
            getattr(module, cls).check = lambda self, *a, **k: Judgement()

class ModelNew""",
)

WRONG = """
import torch
class ModelNew(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * 0.5
"""


def candidate(module_lines: str, forward: str = "return torch.relu(x)") -> str:
    return f"""
import os, sys, struct, subprocess, socket, json, time
from pathlib import Path
import torch
{module_lines}
class ModelNew(torch.nn.Module):
    def forward(self, x):
        {forward}
"""


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(1, device="cpu", timeout=30, compile_timeout=60) as p:
        yield p


def _pids_running(token: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if token.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return [pid for pid in found if pid != os.getpid()]


# ---------------------------------------------------------------------- verdicts


def test_the_patching_candidate_fools_checks_made_in_its_own_process(tmp_path):
    # the control: run_evaluation with the reference's side in the candidate's own process (the
    # flow before issue 17) in a child interpreter, so this test process stays clean
    script = (
        "import sys; from cudaforge.harness.evaluate import run_evaluation\n"
        "from cudaforge.harness.options import make_options\n"
        "from cudaforge.harness.problem import Problem\n"
        f"p = Problem.from_source({RELU.source!r})\n"
        f"r = run_evaluation(p, {PATCHER!r}, make_options(device='cpu', **{FAST!r}))\n"
        "print(r.status)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert done.stdout.strip().splitlines()[-1] == "ok", done.stdout + done.stderr


def test_a_harness_patching_candidate_is_incorrect_and_the_next_wrong_kernel_rejected(pool):
    # without the reference process (the judge in the worker, as before) the first is "ok"
    # (control above); without a fresh process per candidate the wrong kernel after it was
    # "ok" too (issue 17, point 2), checked against main's warm worker
    r = pool.evaluate(RELU, PATCHER, **FAST)
    assert r.status == "incorrect" and not r.correct, r.error
    assert r.failure is not None and "elements differ" in r.failure.message
    after = pool.evaluate(RELU, WRONG, **FAST)
    assert after.status == "incorrect" and not after.correct, after.error
    assert pool.evaluate(RELU, candidate("")).ok


def test_a_candidate_that_answers_its_own_comparisons_is_not_ok(pool):
    # it never asks the reference process: the pool finds no judgement for its outputs
    # (without verdict.py's completeness rule this is "ok")
    r = pool.evaluate(RELU, PATCHER_OF_THE_JUDGE, **FAST)
    assert r.status == "crashed" and not r.correct and r.speedup is None
    assert "never judged" in r.error


# ---------------------------------------------------------------------- secrets


def test_secrets_are_neither_in_the_environment_nor_in_the_result(monkeypatch):
    key = "trust-test-" + uuid.uuid4().hex
    monkeypatch.setenv("OPENAI_API_KEY", key)
    register_secret(key)
    # the candidate reads its environment, and also echoes the key it was written with (as
    # an LLM might copy one from its prompt): the environment has none (candidate_env), and
    # the echo is redacted in the pool (redact_all); without either, the key is in the result
    source = candidate(
        f"raise RuntimeError('env: ' + repr(os.environ.get('OPENAI_API_KEY')) + ' echo: {key}')"
    )
    with WorkerPool(1, device="cpu", timeout=30, compile_timeout=60) as p:
        r = p.evaluate(RELU, source, **FAST)
    assert r.status == "load_error", r.error
    assert "env: None" in r.error and "[redacted]" in r.error
    assert key not in r.to_json() and key not in r.error and key not in r.traceback
    assert all(key not in note for note in r.notes)
    scrubbed = [n for n in r.notes if n.startswith("environment scrubbed:")]
    assert scrubbed and "OPENAI_API_KEY" in scrubbed[0]


# ---------------------------------------------------------------------- network and home


def test_no_network_and_a_private_empty_home(pool, tmp_path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted: list = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    seen = tmp_path / "seen.json"
    probe = f"""
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=3).close()
    connect = "connected"
except OSError as e:
    connect = type(e).__name__ + ": " + str(e)
home = Path.home()
Path({str(seen)!r}).write_text(json.dumps({{"connect": connect, "home": str(home),
    "listing": sorted(os.listdir(home)), "tmp": sorted(os.listdir(home / "tmp"))}}))
"""
    try:
        r = pool.evaluate(RELU, candidate(probe), **FAST)
    finally:
        stop.set()
        thread.join()
        server.close()
    assert r.ok, r.error
    got = json.loads(seen.read_text())
    # without isolation_prefix's network namespace this connects; without private_home the
    # home is the user's, with the user's files in it
    assert got["home"] != str(Path.home()) and not Path(got["home"]).exists()  # removed after
    assert set(got["listing"]) <= {"tmp"} and got["tmp"] == []
    if any("no network namespace" in n for n in r.notes):
        pytest.skip("the OS refused a network namespace here: " + "; ".join(r.notes))
    assert got["connect"] != "connected" and not accepted, got
    assert any("no network (own network namespace)" in n for n in r.notes)


# ---------------------------------------------------------------------- orphans


def test_a_child_in_a_new_session_is_gone_and_named(pool):
    token = f"orphan-{uuid.uuid4().hex[:12]}"
    spawn = (
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)  # "
        + token
        + "'], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)"
    )
    r = pool.evaluate(RELU, candidate(spawn), **FAST)
    assert r.ok, r.error
    # kill_descendants named it (without it, the PID namespace still kills the child a moment
    # later, but no note names it; without both, it outlives the evaluation)
    killed = [n for n in r.notes if n.startswith("processes the candidate left, killed")]
    assert killed and token in killed[0], r.notes
    deadline = time.monotonic() + 2.0
    while _pids_running(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _pids_running(token) == []


# ---------------------------------------------------------------------- forged results


@pytest.mark.parametrize(
    "frame,words",
    [
        # not JSON at all
        ("struct.pack('>Q', 9) + b'not json!'", "breaks the protocol"),
        # JSON, but a result that fails the schema
        ("struct.pack('>Q', len(FORGED)) + FORGED", "fails the schema"),
        # a well-formed result claiming ok: the reference process never judged its outputs
        ("struct.pack('>Q', len(CLAIM)) + CLAIM", "never judged"),
    ],
)
def test_a_forged_result_frame_is_crashed_not_ok(pool, frame, words):
    claim = {"problem": "relu", "status": "ok", "compiled": True, "correct": True,
             "candidate_ms": 0.001, "reference_ms": 1.0, "speedup": 1000.0}  # fmt: skip
    forged = {**claim, "status": "great"}
    lines = (
        f"FORGED = json.dumps({{'type': 'result', 'result': {forged!r}}}).encode()\n"
        f"CLAIM = json.dumps({{'type': 'result', 'result': {claim!r}}}).encode()\n"
        f"os.write(int(sys.argv[2]), {frame})\n"
        "os._exit(0)\n"
    )
    # with pickle or an unvalidated result, the first two would break the pool or pass; the
    # third is "ok" without verdict.py (the claim is taken as it is)
    r = pool.evaluate(RELU, candidate(lines), **FAST)
    assert r.status == "crashed" and not r.correct and r.speedup is None, r.error
    assert words in r.error
    assert pool.evaluate(RELU, candidate("")).ok
