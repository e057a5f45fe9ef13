"""Starting the processes a worker pool talks to: a candidate's worker (one evaluation, then it
exits) and a reference process (never imports a candidate). Both start the same way, in the
sandbox that sandbox.py describes: no network and a PID namespace of their own where the OS
allows (`isolation_prefix`), an environment without keys or tokens (`candidate_env`), a private
HOME that is also the working folder (`private_home`, removed with the process). Each writes its
output to a log file of the pool's, and dies with the pool: the launcher gets a parent-death
signal (`setpriv --pdeathsig KILL`; `unshare --kill-child` then takes the process with it), and
the process itself watches its request pipe for the pool's end (lifeline.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from . import wire
from .sandbox import candidate_env, isolation_prefix, private_home

# the folder above the cudaforge package: the process starts in its private HOME, where
# `python -m cudaforge...` would not find the package through the working folder
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def _with_parent_death_signal() -> list[str]:
    """`setpriv --pdeathsig KILL` where installed: the launcher dies with the thread that
    started it (the pool's), and `unshare --kill-child` or PR_SET_PDEATHSIG passes it on."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL"] if setpriv else []


def sandbox_notes(prefix: list[str], refused: list[str], scrubbed: list[str]) -> list[str]:
    """What isolation a process got, for every result it produces: the namespaces it runs in,
    those the OS refused (with the reason), and the environment names removed (names only)."""
    got = []
    if "--net" in prefix:
        got.append("no network (own network namespace)")
    if "--pid" in prefix:
        got.append("own PID namespace")
    got.append("private HOME and working folder")
    notes = ["sandbox: " + ", ".join(got)]
    notes += [f"sandbox: {why}" for why in refused]
    if scrubbed:
        notes.append("environment scrubbed: " + ", ".join(scrubbed))
    return notes


class SandboxedProcess:
    """One started process: its Popen, its private home, its log, and what isolation it got."""

    def __init__(self, module: str, args: list[str], pass_fds: tuple[int, ...],
                 slot_env: dict[str, str], log_path: Path):  # fmt: skip
        self.log_path = log_path
        self.info: dict[str, Any] = {}
        self.ready = False
        self._home = contextlib.ExitStack()
        home = self._home.enter_context(private_home())
        self.home = home
        base = {**os.environ, **slot_env}
        paths = [PACKAGE_ROOT] + [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p]
        base["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        env, scrubbed = candidate_env(base, home)
        prefix, refused = isolation_prefix()
        self.notes = sandbox_notes(prefix, refused, scrubbed)
        command = [sys.executable, "-m", module, *args]
        if "--pid" in prefix:
            # pid 1 of a namespace ignores the signals it has no handler for (abort() would end
            # in SIGSEGV): a shell is pid 1, the process its child; the shell exits with the
            # child's status, and the namespace goes with it
            command = ["sh", "-c", '"$@" & wait $!', "sh", *command]
        if prefix:
            command = _with_parent_death_signal() + prefix + command
        try:
            with open(log_path, "wb") as log:
                self.popen = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    pass_fds=pass_fds,
                    env=env,
                    cwd=home,
                    start_new_session=True,  # own process group: killed as a whole
                    close_fds=True,
                )
        except BaseException:
            self._home.close()
            raise

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait_ready(self, fd: int, timeout: float) -> str | None:
        """None once the process said it is ready (its message kept in `info`); else why not."""
        if self.ready:
            return None
        try:
            message = wire.recv(fd, time.monotonic() + timeout)
        except wire.MessageLate:
            self.kill()
            return f"did not start within {timeout:.0f} s"
        except wire.PeerClosed:
            return f"exited while starting ({describe_exit(self.popen.wait())})"
        except wire.WireError as e:
            self.kill()
            return f"broke the protocol while starting ({e})"
        if message.get("type") != "ready":
            self.kill()
            return f"sent {str(message.get('type'))[:40]!r} where 'ready' was expected"
        self.info = message
        self.ready = True
        return None

    def kill(self) -> None:
        """SIGKILL the process group (the launcher, the process, what it started there); the
        PID namespace takes the rest. Then remove its home."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self.popen.kill()
        self.popen.wait()
        self._home.close()

    def exit_code(self, wait: float = 5.0) -> int | None:
        try:
            return self.popen.wait(wait)
        except subprocess.TimeoutExpired:
            return None

    def log_tail(self, offset: int = 0, limit: int = 6000) -> str:
        if not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            end = f.tell()
            f.seek(max(offset, end - limit))
            return f.read().decode(errors="replace")

    def host_pids(self) -> list[int]:
        """The launcher and the processes below it, as this process's /proc numbers them."""
        found, todo = [], [self.popen.pid]
        while todo:
            pid = todo.pop()
            found.append(pid)
            for task in _tasks(pid):
                with (
                    contextlib.suppress(OSError, ValueError),
                    open(f"/proc/{pid}/task/{task}/children") as f,
                ):
                    todo += [int(c) for c in f.read().split()]
        return found


def _tasks(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def close_fds(*fds: int) -> None:
    for fd in fds:
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


def describe_exit(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}"
    if code >= 128 and code - 128 in signal.valid_signals():
        # unshare --fork exits 128 + N when its child was killed by signal N
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(code - 128).name}"
    return f"exit code {code}"


__all__ = ["PACKAGE_ROOT", "SandboxedProcess", "close_fds", "describe_exit", "sandbox_notes"]
