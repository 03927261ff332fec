"""Small linear-algebra helpers that keep the agent's proposal cheap with hundreds of trials.

`Square` keeps a growing symmetric matrix (kernel parts between trials, their inverse) in a buffer with
room to spare; `one_blas_thread` runs a method with BLAS on one thread; `forward_solve` is a triangular
solve without a second factorisation; `equal_pairs` finds equal configurations without a full pass.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np


class Square:
    """A symmetric matrix that gains rows and columns, kept in a buffer with room to spare: adding k
    rows to n costs O(nk), not a copy of the n x n (a run adds one trial per proposal)."""

    def __init__(self) -> None:
        self._buf = np.zeros((0, 0))
        self.n = 0

    @property
    def m(self) -> np.ndarray:
        return self._buf[:self.n, :self.n]

    def grow(self, n: int) -> np.ndarray:
        """The matrix resized to n x n (what was there kept; the new rows and columns to be set)."""
        if n > len(self._buf):
            # a quarter more room: the buffer stays within 1.6 n^2, and a copy comes every n/4 rows
            cap = max(n, len(self._buf) + len(self._buf) // 4, 64)
            buf = np.zeros((cap, cap))
            buf[:self.n, :self.n] = self.m
            self._buf = buf
        self.n = n
        return self.m

    def extend(self, block: np.ndarray) -> None:
        """Append rows: `block` [k, n + k] holds the new rows against every old and new one."""
        n_old = self.n
        m = self.grow(n_old + len(block))
        m[n_old:, :] = block
        m[:n_old, n_old:] = block[:, :n_old].T

    def assign(self, full: np.ndarray) -> None:
        self.n = 0
        self.grow(len(full))[:] = full


def one_blas_thread(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run `method` with BLAS on one thread. These matrices are at most a few thousand rows: threads
    only add synchronisation, and on a loaded machine (the agent shares it with workers) two BLAS
    threads waiting for each other made a 500 x 500 solve 5-20x slower than one thread."""
    @functools.wraps(method)
    def limited(*args: Any, **kwargs: Any) -> Any:
        with _blas_controller().limit(limits=1, user_api="blas"):
            return method(*args, **kwargs)
    return limited


@functools.lru_cache(maxsize=1)
def _blas_controller() -> Any:
    from threadpoolctl import ThreadpoolController  # the BLAS numpy loaded (OpenBLAS, MKL, ...)

    return ThreadpoolController()


def forward_solve(L: np.ndarray, b: np.ndarray, block: int = 64) -> np.ndarray:
    """x with L x = b for a lower-triangular L, by blocks: O(n^2) (numpy's solve would factorise L
    again, O(n^3); the marginal likelihood needs one per scale tried)."""
    x = np.empty(len(b))
    for start in range(0, len(b), block):
        end = min(start + block, len(b))
        rhs = b[start:end] - L[start:end, :start] @ x[:start]
        x[start:end] = np.linalg.solve(L[start:end, start:end], rhs)
    return x



def equal_pairs(ids_a: np.ndarray, ids_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(i, j) of every ids_a[i] == ids_b[j], matched by sorting: equal pairs are few, and comparing every
    pair would be another pass over the [a, b] kernel."""
    order = np.argsort(ids_b, kind="stable")
    lo = np.searchsorted(ids_b[order], ids_a, side="left")
    count = np.searchsorted(ids_b[order], ids_a, side="right") - lo
    rows = np.repeat(np.arange(len(ids_a)), count)
    within = np.arange(len(rows)) - np.repeat(np.cumsum(count) - count, count)
    return rows, order[np.repeat(lo, count) + within]
