"""The sandbox primitives with real processes (CPU): secret names, the scrubbed environment, the
private home, the network and PID namespaces, and the killing of a candidate's descendants."""

from __future__ import annotations

import glob
import json
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cudaforge.harness import sandbox, secrets
from cudaforge.harness.sandbox import (
    candidate_env,
    isolation_prefix,
    private_home,
)
from cudaforge.harness.secrets import is_secret_name, redact, redact_all, register_secret

REPO = Path(__file__).resolve().parent.parent


def _alive(pid: int) -> bool:
    """Whether `pid` is a living process (a zombie is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


# ---------------------------------------------------------------- secrets


@pytest.mark.parametrize(
    "name",
    ["OPENAI_API_KEY", "MY_TOKEN", "hf_token", "APIKEY", "GH_AUTHTOKEN", "AWS_SECRET_ACCESS_KEY",
     "PGPASSWORD", "GOOGLE_APPLICATION_CREDENTIALS", "DB_PASSWD", "SIGNING_KEYS", "client-secret"],
)  # fmt: skip
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    ["PATH", "HOME", "KEYBOARD", "XKB_KEYMAP", "TOKENIZERS_PARALLELISM", "CUDA_VISIBLE_DEVICES",
     "PYTHONPATH", "CUDAFORGE_CACHE_DIR", "PWD", "TERM"],
)  # fmt: skip
def test_names_that_are_not_secrets(name):
    assert not is_secret_name(name)


def test_redact_covers_registered_values_key_shapes_and_url_passwords():
    register_secret("FIXTURE-registered-value-1234")
    register_secret("x" * 10)  # a short secret inside a key-shaped token cuts no hole in it
    text = (
        "a FIXTURE-registered-value-1234 b ghp_" + "x" * 36 + " c hf_" + "Y" * 34
        + " d AKIAABCDEFGHIJKLMNOP e https://me:pa55word@proxy:8080/x f sk-ant-FIXTUREFIXTUREFIXTURE"
    )  # fmt: skip
    clean = redact(text)
    for secret in ("registered-value", "ghp_", "hf_", "AKIA", "pa55word", "sk-ant"):
        assert secret not in clean
    assert "https://me:[redacted]@proxy:8080/x" in clean
    # ordinary code and logs stay as they are
    for text in ("mask-abcdefghijklmnopqrstuvwxyz", "hf_kernel_name(x)", "a_key = 3", "/tmp/x"):
        assert redact(text) == text
    assert redact_all({"e": ["FIXTURE-registered-value-1234", 1.5]}) == {"e": ["[redacted]", 1.5]}


def test_providers_use_the_harness_registry():
    from cudaforge.agents import providers

    providers.register_secret("FIXTURE-from-the-llm-layer")
    assert "FIXTURE-from-the-llm-layer" in secrets.registered_secrets()
    assert providers.redact is secrets.redact


# ---------------------------------------------------------------- environment and home


def test_candidate_env_scrubs_secrets_and_keeps_what_cuda_needs(tmp_path):
    register_secret("FIXTURE-innocent-looking-secret")
    base = {
        "PATH": "/usr/local/bin:/usr/bin",
        "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
        "CUDA_VISIBLE_DEVICES": "3",
        "PYTHONPATH": "relative/dir:/abs/dir",
        "OPENAI_API_KEY": "sk-FIXTUREFIXTUREFIXTUREFIXTURE",
        "MY_TOKEN": "abc",
        "BUILD_LABEL": "prefix FIXTURE-innocent-looking-secret suffix",
        "SSH_AUTH_SOCK": "/tmp/ssh-agent.sock",
        "CUDAFORGE_CACHE_DIR": "relative-cache",
        "CUDAFORGE_ARCH": "sm_90",
        "KEYBOARD": "us",
        "HOME": "/home/someone",
    }
    home = tmp_path / "home"
    home.mkdir()
    env, removed = candidate_env(base, home)
    assert removed == ["BUILD_LABEL", "MY_TOKEN", "OPENAI_API_KEY", "SSH_AUTH_SOCK"]
    for name in removed:
        assert name not in env
    assert not any("FIXTURE" in value for value in env.values())
    assert env["PATH"] == base["PATH"] and env["LD_LIBRARY_PATH"] == base["LD_LIBRARY_PATH"]
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["CUDAFORGE_ARCH"] == "sm_90"
    assert env["KEYBOARD"] == "us"
    assert env["PYTHONPATH"] == f"{os.path.abspath('relative/dir')}:/abs/dir"
    # the compile cache stays the user's, as an absolute path: the private HOME does not hide it
    assert env["CUDAFORGE_CACHE_DIR"] == os.path.abspath("relative-cache")
    assert env["TORCH_EXTENSIONS_DIR"] == "/home/someone/.cache/torch_extensions"
    assert env["HOME"] == str(home) and env["PWD"] == str(home)
    for name in ("TMPDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME"):
        assert env[name].startswith(str(home) + os.sep)
    assert Path(env["TMPDIR"]).is_dir()


def test_candidate_env_default_cache_is_the_one_cudaforge_uses(tmp_path, monkeypatch):
    from cudaforge.cuda.kernel import cache_dir

    monkeypatch.delenv("CUDAFORGE_CACHE_DIR", raising=False)
    env, _ = candidate_env(dict(os.environ), tmp_path)
    assert env["CUDAFORGE_CACHE_DIR"] == str(cache_dir().absolute())
    assert not env["CUDAFORGE_CACHE_DIR"].startswith(str(tmp_path))


def test_private_home_is_private_and_gone_afterwards():
    with private_home() as home:
        assert home.is_dir() and home != Path.home().absolute()
        assert not str(home).startswith(str(Path.home()) + os.sep)
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
        (home / "left-behind").write_text("x")
        env, _ = candidate_env(dict(os.environ), home)
        child = subprocess.run(
            [sys.executable, "-c", "import os; print(os.path.expanduser('~')); print(os.getcwd())"],
            capture_output=True, text=True, env=env, cwd=home, check=True, timeout=60,
        )  # fmt: skip
        assert child.stdout.split() == [str(home), str(home)]
    assert not home.exists()


# ---------------------------------------------------------------- namespaces


_NETWORK_PROBE = """
import fcntl, glob, json, os, socket, struct, sys
names = [line.split(":")[0].strip() for line in open("/proc/net/dev").readlines()[2:]]
flags = {}
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    for name in names:
        ifreq = struct.pack("16sH14s", name.encode(), 0, b"")
        flags[name] = struct.unpack("16sH14s", fcntl.ioctl(s, 0x8913, ifreq))[1]  # SIOCGIFFLAGS
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2).close()
    connected = "yes"
except OSError as exc:
    connected = repr(exc)
print(json.dumps({"interfaces": names, "lo_up": bool(flags.get("lo", 0) & 1),
                  "connected": connected, "pid": os.getpid(),
                  "devices": sorted(glob.glob("/dev/nvidia*")), "python": sys.version_info[:2]}))
"""


@pytest.fixture
def loopback_server():
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    yield server.getsockname()[1]
    server.close()


def _probe_network(prefix: list[str], port: int) -> dict:
    child = subprocess.run(
        [*prefix, sys.executable, "-c", _NETWORK_PROBE, str(port)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert child.returncode == 0, child.stderr
    return json.loads(child.stdout)


def test_isolation_prefix_blocks_loopback_tcp(loopback_server):
    prefix, notes = isolation_prefix()
    if "--net" not in prefix:
        pytest.skip("; ".join(notes))
    assert not [n for n in notes if n.startswith("no network")]
    # without the prefix the same child reaches the server: the check below can fail
    assert _probe_network([], loopback_server)["connected"] == "yes"
    seen = _probe_network(prefix, loopback_server)
    assert seen["interfaces"] == ["lo"] and not seen["lo_up"]
    assert seen["connected"] != "yes"
    # the GPU's device files (where there are any) and Python work as outside
    assert seen["devices"] == sorted(glob.glob("/dev/nvidia*"))
    assert seen["python"] == list(sys.version_info[:2])
    if "--pid" in prefix:
        assert seen["pid"] == 1


def test_a_worker_starts_in_the_sandbox_and_imports_torch_and_cudaforge():
    prefix, _ = isolation_prefix()
    with private_home() as home:
        env, _ = candidate_env({**os.environ, "PYTHONPATH": str(REPO)}, home)
        code = "import torch, cudaforge, os; print(torch.zeros(2).sum().item(), os.getcwd())"
        child = subprocess.run(
            [*prefix, sys.executable, "-c", code],
            capture_output=True, text=True, env=env, cwd=home, timeout=120, check=False,
        )  # fmt: skip
        assert child.returncode == 0, child.stderr
        assert child.stdout.split() == ["0.0", str(home)]


def _processes_with(marker: str) -> list[int]:
    """Pids of the living processes whose command line holds `marker` (anywhere on the host)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() in f.read() and _alive(int(entry)):
                    found.append(int(entry))
        except (OSError, ValueError):
            continue
    return found


@pytest.mark.parametrize("pid_namespace", [False, True])
def test_the_pid_namespace_ends_every_process_left_in_it(pid_namespace):
    prefix, notes = isolation_prefix(pid_namespace)
    if pid_namespace and "--pid" not in prefix:
        pytest.skip("; ".join(notes))
    marker = f"cudaforge-test-orphan-{os.getpid()}-{pid_namespace}"
    candidate = _CANDIDATE.replace("time.sleep(60)", f"time.sleep(60)  # {marker}")
    # the first process starts a child in a new session and exits at once
    subprocess.run([*prefix, sys.executable, "-c", candidate], timeout=60, check=True,
                   capture_output=True)  # fmt: skip
    time.sleep(0.2)
    leftovers = _processes_with(marker)
    for pid in leftovers:
        os.kill(pid, 9)
    # without a PID namespace the child outlives its parent; with one it is gone with pid 1
    assert bool(leftovers) is not pid_namespace


def test_isolation_prefix_is_probed_once():
    sandbox._probe.cache_clear()
    started = time.monotonic()
    first = isolation_prefix()
    assert time.monotonic() - started < sandbox._PROBE_TIMEOUT + 1
    started = time.monotonic()
    assert isolation_prefix() == first and time.monotonic() - started < 0.01
    first[0].append("mutated")  # callers get copies
    assert "mutated" not in isolation_prefix()[0]


def test_isolation_prefix_says_which_namespace_is_refused(tmp_path, monkeypatch):
    fake = tmp_path / "unshare"
    fake.write_text(
        "#!/bin/sh\n"
        'case "$*" in *--net*) echo "unshare: unshare failed: Operation not permitted" >&2;'
        " exit 1;; esac\n"
        "exit 0\n"
    )
    fake.chmod(0o755)
    real_which = sandbox.shutil.which
    monkeypatch.setattr(
        sandbox.shutil, "which", lambda n: str(fake) if n == "unshare" else real_which(n)
    )
    sandbox._probe.cache_clear()
    try:
        prefix, notes = isolation_prefix()
        assert "--net" not in prefix and "--pid" in prefix and prefix[0] == str(fake)
        assert len(notes) == 1 and notes[0].startswith("no network namespace: ")
        assert "Operation not permitted" in notes[0]
        monkeypatch.setattr(sandbox.shutil, "which", lambda n: None)
        sandbox._probe.cache_clear()
        prefix, notes = isolation_prefix()
        assert prefix == [] and all("not installed" in n for n in notes) and len(notes) == 2
    finally:
        sandbox._probe.cache_clear()


# ---------------------------------------------------------------- descendants


# A "candidate": starts a child in a new session that sleeps, prints its pid and exits at once.
_CANDIDATE = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                         start_new_session=True, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(child.pid, flush=True)
"""

# A "worker": runs the candidate, optionally with the sandbox's subreaper and kill.
_WORKER = """
import json, subprocess, sys, time
from cudaforge.harness.sandbox import become_subreaper, descendants, kill_descendants
sandboxed = sys.argv[1] == "sandboxed"
if sandboxed:
    assert become_subreaper()
candidate = subprocess.run([sys.executable, "-c", sys.argv[2]], capture_output=True, text=True)
orphan = int(candidate.stdout)
time.sleep(0.2)
def alive(pid):
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
report = {"orphan": orphan, "alive_before": alive(orphan),
          "found": [pid for pid, _ in descendants()]}
report["killed"] = kill_descendants() if sandboxed else []
report["alive_after"] = alive(orphan)
print(json.dumps(report))
"""


def _run_worker(mode: str) -> dict:
    child = subprocess.run(
        [sys.executable, "-c", _WORKER, mode, _CANDIDATE],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert child.returncode == 0, child.stderr
    return json.loads(child.stdout)


def test_a_child_in_a_new_session_outlives_its_parent_without_the_sandbox():
    report = _run_worker("plain")
    try:
        # the candidate has exited; its child lives on, no longer a descendant of the worker
        assert report["alive_before"] and report["orphan"] not in report["found"]
        time.sleep(0.2)
        assert _alive(report["orphan"])
    finally:
        os.kill(report["orphan"], 9) if _alive(report["orphan"]) else None


def test_kill_descendants_kills_a_child_that_left_the_session():
    report = _run_worker("sandboxed")
    orphan = report["orphan"]
    try:
        assert report["alive_before"] and orphan in report["found"]  # re-parented to the worker
        assert not report["alive_after"]
        assert any(line.startswith(f"pid {orphan}: ") and "time.sleep(60)" in line
                   for line in report["killed"])  # fmt: skip
        time.sleep(0.1)
        assert not _alive(orphan)
    finally:
        if _alive(orphan):
            os.kill(orphan, 9)


def test_kill_descendants_with_nothing_to_kill_is_quick():
    code = (
        "import time; from cudaforge.harness.sandbox import descendants, kill_descendants\n"
        "started = time.monotonic(); print(kill_descendants(), descendants(),"
        " time.monotonic() - started < 1.0)"
    )
    child = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert child.stdout.split() == ["[]", "[]", "True"]
