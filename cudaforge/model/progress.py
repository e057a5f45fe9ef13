"""Progress of a long optimize() or load(): a tqdm bar over the hot spots when tqdm is
installed, else plain lines on stderr."""

from __future__ import annotations

import sys
import threading


class Progress:
    """tqdm when it is installed (a bar over the hot spots), else plain lines on stderr."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.bar = None
        self._lock = threading.Lock()

    def say(self, text: str) -> None:
        if not self.enabled:
            return
        with self._lock:
            if self.bar is not None:
                self.bar.write(f"cudaforge: {text}")
            else:
                print(f"cudaforge: {text}", file=sys.stderr, flush=True)

    def start(self, total: int, what: str) -> None:
        if not self.enabled:
            return
        try:
            from tqdm.auto import tqdm
        except ImportError:
            self.say(f"{what}: {total} hot spot(s)")
            return
        self.bar = tqdm(total=total, desc=f"cudaforge {what}", unit="hot spot", leave=True)

    def step(self, text: str) -> None:
        if self.bar is not None:
            with self._lock:
                self.bar.update(1)
                self.bar.set_postfix_str(text[:60])
        else:
            self.say(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


__all__ = ["Progress"]
