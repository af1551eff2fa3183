"""Replay memory for the memory-based baselines (Neural-Linear, LiM2, Neural-Greedy, Neural-TS).

A ``Memory`` is an immutable view of the last n observations (s, a, y), unlimited or a FIFO of
fixed capacity. ``push`` returns a new Memory. Views share one append-only buffer: a push
writes only past the end of every existing view, and copies the window first when it is not the
newest view, so earlier Memory objects never change. Appending is amortised O(N_s).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["Memory"]


class _Buffer:
    __slots__ = ("S", "A", "Y", "used")

    def __init__(self, n_features, size):
        self.S = np.empty((size, n_features))
        self.A = np.empty(size, dtype=np.int64)
        self.Y = np.empty(size)
        self.used = 0


class Memory:
    """The last ``len(self)`` observations; ``capacity`` None means unlimited.

    contexts (n, N_s), actions (n,), rewards (n,) are read-only views.
    """

    __slots__ = ("_buf", "_start", "_n", "capacity")

    def __init__(self, n_features: int, capacity: int | None = None, _buf: _Buffer | None = None, _start: int = 0,
                 _n: int = 0) -> None:
        if capacity is not None:
            if isinstance(capacity, (bool, np.bool_)) or not isinstance(capacity, (int, np.integer)) or capacity < 1:
                raise ValueError(f"capacity must be None or an integer >= 1; got {capacity!r}")
            capacity = int(capacity)
        self.capacity = capacity
        self._buf = _Buffer(int(n_features), 16) if _buf is None else _buf
        self._start = _start
        self._n = _n

    @classmethod
    def from_arrays(cls, contexts: ArrayLike, actions: ArrayLike, rewards: ArrayLike,
                    capacity: int | None = None) -> Memory:
        """A memory holding the given rows (only the last ``capacity`` if limited)."""
        S = np.asarray(contexts, dtype=np.float64)
        mem = cls(S.shape[1], capacity)
        for s, a, y in zip(S, np.asarray(actions), np.asarray(rewards, dtype=np.float64)):
            mem = mem.push(s, int(a), float(y))
        return mem

    def __len__(self):
        return self._n

    def _view(self, arr):
        v = arr[self._start:self._start + self._n]
        v.setflags(write=False)
        return v

    @property
    def contexts(self) -> NDArray[np.float64]:
        """(n, N_s) read-only view of the stored contexts, oldest first."""
        return self._view(self._buf.S)

    @property
    def actions(self) -> NDArray[np.int64]:
        """(n,) read-only view of the stored arm indices, oldest first."""
        return self._view(self._buf.A)

    @property
    def rewards(self) -> NDArray[np.float64]:
        """(n,) read-only view of the stored rewards, oldest first."""
        return self._view(self._buf.Y)

    def push(self, s: ArrayLike, a: int, y: float) -> Memory:
        """A new Memory with (s, a, y) appended (and the oldest row dropped if over capacity)."""
        buf, start, n = self._buf, self._start, self._n
        end = start + n
        if buf.used != end or end == buf.S.shape[0]:
            new = _Buffer(buf.S.shape[1], max(16, 2 * (n + 1)))
            new.S[:n], new.A[:n], new.Y[:n] = buf.S[start:end], buf.A[start:end], buf.Y[start:end]
            new.used = n
            buf, start, end = new, 0, n
        buf.S[end], buf.A[end], buf.Y[end] = s, a, y
        buf.used = end + 1
        n += 1
        if self.capacity is not None and n > self.capacity:
            start, n = start + 1, n - 1
        return Memory(buf.S.shape[1], self.capacity, buf, start, n)
