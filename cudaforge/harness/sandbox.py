"""The sandbox a candidate's process runs in: what the OS allows, used where it allows it.

Parent side: `candidate_env` (the environment without keys or tokens, HOME and the temporary
folders inside a private home), `private_home` (that home: a fresh 0700 folder, removed
afterwards) and `isolation_prefix` (the `unshare` command prefix that gives the process no
network and its own PID namespace, with a note for each namespace the OS refuses).
Worker side: `become_subreaper`, `descendants` and `kill_descendants`, so that no process a
candidate started outlives its evaluation, those that left its session included.

None of this fails an evaluation: what is not available is left out and said in a note.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import getpass
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from ..cuda.kernel import cache_dir
from .secrets import is_secret_name, redact

# Variables that hand out a capability rather than a value: the user's SSH and GPG agents, the
# session bus, Kerberos tickets, the per-user runtime folder (sockets of the desktop session).
_AGENT_VARIABLES = (
    "SSH_AUTH_SOCK",
    "SSH_AGENT_PID",
    "GPG_AGENT_INFO",
    "DBUS_SESSION_BUS_ADDRESS",
    "KRB5CCNAME",
    "XDG_RUNTIME_DIR",
)
# folder lists whose relative entries would move with the working directory
_PATH_LISTS = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH")
_PR_SET_CHILD_SUBREAPER = 36
_PROBE_TIMEOUT = 5.0  # s; the probe runs three `unshare ... true`, a few ms each


# ---------------------------------------------------------------- environment and home


def _user_caches(base: Mapping[str, str]) -> dict[str, str]:
    """Where the caches a worker fills live for the user (absolute paths), so that a private
    HOME or TMPDIR does not make every candidate start cold: cudaforge's compile cache, torch's
    extension builds (load_inline), torch.compile's cache (Triton's inside it, unless
    TRITON_CACHE_DIR is set) and the driver's PTX JIT cache. Each is the variable's value when
    set, else the tool's default for the user's HOME and TMPDIR."""
    home = base.get("HOME") or os.path.expanduser("~")
    xdg_cache = base.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
    temp = base.get("TMPDIR") or tempfile.gettempdir()
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    if base.get("CUDAFORGE_CACHE_DIR"):
        cudaforge_cache = os.path.expanduser(base["CUDAFORGE_CACHE_DIR"])
    else:
        cudaforge_cache = str(cache_dir())
    defaults = {
        "CUDAFORGE_CACHE_DIR": cudaforge_cache,
        "TORCH_EXTENSIONS_DIR": os.path.join(xdg_cache, "torch_extensions"),
        # torch's rule: <temp>/torchinductor_<user>, the user name without path characters
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(
            temp, "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user)
        ),
        "CUDA_CACHE_PATH": os.path.join(home, ".nv", "ComputeCache"),
    }
    if base.get("TRITON_CACHE_DIR"):
        defaults["TRITON_CACHE_DIR"] = base["TRITON_CACHE_DIR"]
    return {name: os.path.abspath(base.get(name) or path) for name, path in defaults.items()}


def candidate_env(base: Mapping[str, str], home: Path) -> tuple[dict[str, str], list[str]]:
    """The environment a candidate's process starts with, and the names removed from `base`.

    Removed: every variable whose name marks a secret (`is_secret_name`), whose value holds a
    registered secret or a key-shaped string (`redact` would change it), and the agent sockets.
    HOME, the working folder, TMPDIR and the XDG folders point into `home`. Kept: everything
    else, e.g. PATH, LD_LIBRARY_PATH, PYTHONPATH (relative entries made absolute: the process
    starts in `home`), CUDA_VISIBLE_DEVICES and the CUDAFORGE_* settings; the caches stay where
    they are for the user (`CUDAFORGE_CACHE_DIR` and torch's, as absolute paths).
    """
    home = Path(home).absolute()
    removed = []
    env: dict[str, str] = {}
    for name, value in base.items():
        if is_secret_name(name) or name in _AGENT_VARIABLES or redact(value) != value:
            removed.append(name)
        else:
            env[name] = value
    for name in _PATH_LISTS:
        if env.get(name):
            env[name] = os.pathsep.join(os.path.abspath(p) for p in env[name].split(os.pathsep))
    for name in ("CUDAFORGE_LIBCUDA", "CUDAFORGE_LIBNVRTC", "CUDAFORGE_LIBCUPTI"):
        # a path (not a bare soname such as libcuda.so.1) stays valid from another folder
        if os.sep in env.get(name, ""):
            env[name] = os.path.abspath(env[name])
    env.update(_user_caches(base))
    temp = home / "tmp"
    temp.mkdir(mode=0o700, exist_ok=True)
    env.update(
        HOME=str(home),
        PWD=str(home),
        TMPDIR=str(temp),
        TMP=str(temp),
        TEMP=str(temp),
        XDG_CACHE_HOME=str(home / ".cache"),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_DATA_HOME=str(home / ".local" / "share"),
        XDG_STATE_HOME=str(home / ".local" / "state"),
    )
    env.pop("OLDPWD", None)
    return env, sorted(removed)


@contextlib.contextmanager
def private_home() -> Iterator[Path]:
    """A fresh temporary folder (mode 0700) to be a candidate's HOME and working folder;
    removed, with everything the candidate wrote there, when the block ends."""
    path = Path(tempfile.mkdtemp(prefix="cudaforge-candidate-"))
    try:
        os.chmod(path, 0o700)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------- namespaces


def isolation_prefix(pid_namespace: bool = True) -> tuple[list[str], list[str]]:
    """(argv prefix, notes): the command prefix that starts a process with no network (a new
    network namespace: only `lo`, and it is down) and, with `pid_namespace`, in its own PID
    namespace (it is pid 1 there; when it exits, every process it left is killed), e.g.
    `["unshare", "--net", "--pid", "--fork", "--mount-proc", "--kill-child"]`, with `--user --map-root-user`
    when not root. A namespace the OS refuses is left out, and `notes` says which and why.
    Probed once per process, in one `sh` subprocess of a few ms that cannot hang."""
    prefix, notes = _probe(pid_namespace)
    return list(prefix), list(notes)


@functools.cache
def _probe(pid_namespace: bool) -> tuple[list[str], list[str]]:
    unshare = shutil.which("unshare")
    wanted = ["network"] + (["PID"] if pid_namespace else [])
    if unshare is None:
        return [], [f"no {w} namespace: util-linux's `unshare` is not installed" for w in wanted]
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    net = ["--net"]
    # CUDA needs a /proc of the new namespace: without --mount-proc it fails to start there
    # (cudaGetDeviceCount: error 304 on the H200, 2026-12-03)
    pid = ["--pid", "--fork", "--mount-proc", "--kill-child"] if pid_namespace else []
    attempts = {"both": net + pid, "network": net, "PID": pid}
    # one line per attempt, "<what> ok" or "<what> <unshare's message>"; the namespaces one
    # by one only when both together are refused
    script = "".join(
        f'r=$({{ {shlex.join([unshare, *user, *flags])} true 2>&1 && echo ok; }} | tr "\\n" " ")\n'
        f'echo "{what} $r"\n' + ('[ "$r" = "ok " ] && exit 0\n' if what == "both" else "")
        for what, flags in attempts.items()
        if flags
    )
    try:
        probe = subprocess.run(
            ["sh", "-c", script],
            check=False,
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
        answers = dict(line.split(" ", 1) for line in probe.stdout.splitlines() if " " in line)
    except (OSError, subprocess.SubprocessError) as exc:
        return [], [f"no {w} namespace: the probe of `unshare` failed ({exc})" for w in wanted]
    if answers.get("both", "").strip() == "ok":
        return [unshare, *user, *net, *pid], []
    flags, notes = [], []
    for what, part in (("network", net), ("PID", pid)):
        if not part:
            continue
        answer = answers.get(what, "no answer").strip()
        if answer == "ok":
            flags += part
        else:
            why = answer.splitlines()[-1] if answer else "refused"
            notes.append(f"no {what} namespace: `unshare {' '.join(user + part)}` failed: {why}")
    return ([unshare, *user, *flags] if flags else []), notes


# ---------------------------------------------------------------- descendants (worker side)


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (PR_SET_CHILD_SUBREAPER), so a
    process the candidate started in a new session is re-parented here, not to init, and
    `kill_descendants` finds it. False where the OS does not allow it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _own_pid() -> int:
    """This process's pid as /proc numbers it (in a new PID namespace os.getpid() is 1 while
    /proc may still be the host's)."""
    try:
        return int(os.readlink("/proc/self"))
    except (OSError, ValueError):
        return os.getpid()


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state letter) of every process /proc lists."""
    table = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    stat = f.read().decode(errors="replace")
            except OSError:
                continue  # exited while we looked
            # "pid (command) state ppid ...": the command may hold spaces and parentheses
            fields = stat[stat.rfind(")") + 2 :].split()
            if len(fields) >= 2:
                table[int(entry.name)] = (int(fields[1]), fields[0])
    return table


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(4096)
    except OSError:
        return "?"
    text = raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
    if not text:  # a kernel thread or a zombie: its name instead
        with contextlib.suppress(OSError), open(f"/proc/{pid}/comm", "rb") as f:
            text = "[" + f.read().decode(errors="replace").strip() + "]"
    return redact(text[:200])


def descendants(pid: int | None = None) -> list[tuple[int, str]]:
    """(pid, command line) of every living descendant of `pid` (default: this process), pids
    as /proc numbers them, parents before their children; zombies are left out."""
    root = _own_pid() if pid is None else pid
    table = _processes()
    children: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    found, todo = [], list(children.get(root, []))
    while todo:
        child = todo.pop(0)
        todo += children.get(child, [])
        if table[child][1] != "Z":
            found.append((child, _cmdline(child)))
    return found


def _reap() -> None:
    """Collect the exit status of every child that has ended (orphans re-parented to us
    included), so none stays a zombie."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def kill_descendants(timeout: float = 2.0) -> list[str]:
    """SIGKILL every descendant of this process, again and again until none is left or
    `timeout` (s) has passed, and reap them; returns one line per process killed,
    "pid 123: python -c ...". Those that left the session are found when this process is their
    subreaper (`become_subreaper`) or the PID namespace's pid 1."""
    killed: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    while True:
        living = descendants()
        if not living:
            break
        # stop them all first, so that none forks a replacement between the kills
        for pid, _ in living:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP)
        for pid, command in living:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.setdefault(pid, command)
        _reap()
        if time.monotonic() > deadline:
            break
        time.sleep(0.005)
    _reap()
    return [f"pid {pid}: {command}" for pid, command in killed.items()]


__all__ = [
    "become_subreaper",
    "candidate_env",
    "descendants",
    "isolation_prefix",
    "kill_descendants",
    "private_home",
]
