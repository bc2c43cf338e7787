"""The inputs of the Python example and tests, and what a dispatch and combine
must give for them, computed here from the definition (numpy, no goep code):
the same as capi/examples/ep_reference.h, so that the C and Python programs
check the same thing.

Token t of rank r has values r, t mod 16 and small integers; its top-k
experts are spread over the ranks with some slots -1; its gate weights are 1,
1/2, 1/4 or 1/8. Every product and sum has at most 8 significant bits, so the
reference is exact in float32 and bfloat16, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Shape:
    nranks: int
    num_experts: int
    topk: int
    hidden: int
    max_tokens: int

    @property
    def local_experts(self) -> int:
        return self.num_experts // self.nranks

    def tokens_of(self, rank: int) -> int:
        return max(self.max_tokens - rank % 3, 0)


def values(rank: int, T: int, H: int) -> np.ndarray:
    """The tokens of rank as float32 [T, H]."""
    t = np.arange(T)[:, None]
    h = np.arange(H)[None, :]
    v = ((rank * 7 + t * 3 + h) % 17 - 8).astype(np.float32)
    if H > 0:
        v[:, 0] = rank
    if H > 1:
        v[:, 1] = np.arange(T) % 16
    return v


def experts(s: Shape, rank: int) -> np.ndarray:
    """The top-k expert ids of rank's tokens, int64 [T, K], -1 = none."""
    T = s.tokens_of(rank)
    t = np.arange(T)[:, None]
    k = np.arange(s.topk)[None, :]
    stride = max(s.num_experts // s.topk, 1)
    e = (rank * 5 + t * 3 + k * stride) % s.num_experts
    return np.where((rank + 2 * t + k) % 5 == 4, -1, e).astype(np.int64)


def weights(T: int, K: int) -> np.ndarray:
    t = np.arange(T)[:, None]
    k = np.arange(K)[None, :]
    return np.array([1.0, 0.5, 0.25, 0.125], dtype=np.float32)[(t + k) % 4]


def to_bf16(f: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), round to nearest even."""
    u = np.ascontiguousarray(f, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(b: np.ndarray) -> np.ndarray:
    return (np.ascontiguousarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def combined(s: Shape, rank: int, masked=()) -> np.ndarray:
    """out of a combine with identity experts: each token times the sum of the
    weights of its slots whose expert is not on a masked rank; float32 [T, H]."""
    T = s.tokens_of(rank)
    e = experts(s, rank)
    w = weights(T, s.topk)
    keep = (e >= 0) & ~np.isin(e // s.local_experts, list(masked))
    acc = np.zeros((T, s.hidden), dtype=np.float32)
    for k in range(s.topk):  # slot order, as the combine accumulates
        acc += np.where(keep[:, k : k + 1], w[:, k : k + 1], np.float32(0)) * values(rank, T, s.hidden)
    return acc


def received_ll(s: Shape, me: int) -> list[list[tuple[int, int]]]:
    """Per local expert, the (source rank, token) of each row, in order."""
    out = [[] for _ in range(s.local_experts)]
    for src in range(s.nranks):
        e = experts(s, src)
        for t in range(s.tokens_of(src)):
            for l in range(s.local_experts):
                if me * s.local_experts + l in e[t]:
                    out[l].append((src, t))
    return out


def received_ht(s: Shape, me: int):
    """The rows an HT dispatch brings to rank me, in order: (source rank,
    token, local ids [K] with -1 elsewhere, weights [K] with 0 elsewhere)."""
    rows = []
    L = s.local_experts
    for src in range(s.nranks):
        e = experts(s, src)
        w = weights(s.tokens_of(src), s.topk)
        for t in range(s.tokens_of(src)):
            mine = (e[t] >= 0) & (e[t] // L == me)
            if mine.any():
                rows.append((src, t, np.where(mine, e[t] - me * L, -1), np.where(mine, w[t], np.float32(0))))
    return rows
