"""A dependency-free text progress bar for long scans."""

import sys
import time


class Progress:
    """Prints ``label  k/n  rate`` to stderr at most ``per_second`` times a second."""

    def __init__(self, total, label="scan", enabled=True, stream=None, per_second=4.0):
        self.total = int(total)
        self.label = label
        self.enabled = bool(enabled)
        self.stream = sys.stderr if stream is None else stream
        self.interval = 1.0 / per_second
        self.start = self.last = time.perf_counter()
        self.count = 0

    def advance(self, k=1):
        self.count += k
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self.last >= self.interval or self.count >= self.total:
            self.last = now
            self._draw(now)

    def _draw(self, now):
        frac = self.count / self.total if self.total else 1.0
        width = 30
        bar = "#" * int(width * frac) + "-" * (width - int(width * frac))
        rate = self.count / max(now - self.start, 1e-12)
        self.stream.write(f"\r{self.label} [{bar}] {self.count}/{self.total} {rate:.1f} it/s")
        if self.count >= self.total:
            self.stream.write("\n")
        self.stream.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.enabled and self.count < self.total:
            self.stream.write("\n")
            self.stream.flush()
        return False
