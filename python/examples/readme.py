#!/usr/bin/env python3
"""The Python rounds of README.md (low latency) and docs/capi.md (high throughput) as a complete
program: bfloat16 tokens dispatched and combined over every rank, each expert scaling its rows by
a power of two, and every combined value checked against out[t] = sum over k of w[t, k] *
scale(expert) * x[t], computed on the token's rank from its own inputs alone.
scripts/check-snippets.sh checks that the lines the two documents show are this file's, and runs
it:

    mpirun -np 2 python3 python/examples/readme.py

Exits non-zero when any rank's values differ.
"""

from mpi4py import MPI            # initialises MPI (MPI_THREAD_MULTIPLE)
import numpy as np
import goep.ep as nccl_ep         # the only line that differs from a program for nccl.ep

import sys


def to_bf16(f):
    """float -> bfloat16 bits (np.uint16), rounded to nearest, ties to even."""
    u = np.ascontiguousarray(f, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(b):
    return (np.ascontiguousarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def scale(e):
    """What expert e multiplies its rows by: 1, 2 or 4, exact in bfloat16."""
    return (1 << (np.asarray(e) % 3)).astype(np.float32)


def inputs(rank, T, hidden, num_experts):
    """A rank's tokens (multiples of 1/8 in [-1, 1], exact in bfloat16), each sent to 8 different
    experts (7 is prime to num_experts) but one in five to 7, and gate weights 1/2, ... 1/9."""
    t, i, k = np.arange(T)[:, None], np.arange(hidden)[None, :], np.arange(8)[None, :]
    x = to_bf16(((rank * 131 + t * 7 + i) % 17 - 8) / 8)
    topk_idx = ((t + 7 * k + 3 * rank) % num_experts).astype(np.int64)
    topk_idx[(t[:, 0] % 5 == 0), 7] = -1
    w = np.tile(1 / (k + 2), (T, 1)).astype(np.float32)
    return x, topk_idx, w


def check(name, out, x, topk_idx, w):
    """This rank's combined tokens against the reference, in float64. The library rounds to
    bfloat16 at most twice (the experts' rows in HT, the sum), within 1/128 of the magnitude of a
    value's terms; a wrong or missing term is over 1/66 of it (weights 1/2 to 1/9, scales 1 to 4)."""
    terms = np.where(topk_idx >= 0, w * scale(np.maximum(topk_idx, 0)), 0).astype(np.float64)
    xv = from_bf16(x).astype(np.float64)
    want = terms.sum(axis=1, keepdims=True) * xv
    mag = np.abs(terms).sum(axis=1, keepdims=True) * np.abs(xv)
    got = from_bf16(out).astype(np.float64)
    bad = np.argwhere(np.abs(got - want) > mag / 100)
    return [f"{name}: token {t} element {i}: combined {got[t, i]}, want {want[t, i]}" for t, i in bad[:5]]


def ll_round(nranks, rank):
    """README.md's round: low latency, expert-major."""
    T, L = 96, 32 // nranks
    # x: [T, 7168] bfloat16 bits (np.uint16); topk_idx: [T, 8] int64 (-1: no expert); w: [T, 8] float32
    x, topk_idx, w = inputs(rank, T, 7168, 32)
    # recv: [local experts, nranks * 128, 7168] like x; counts: [local experts] int32; out: [T, 7168]
    recv = np.zeros((L, nranks * 128, 7168), np.uint16)
    counts = np.zeros(L, np.int32)
    out = np.zeros((T, 7168), np.uint16)
    group = nccl_ep.Group.create(MPI.COMM_WORLD, nccl_ep.GroupConfig(
        algorithm=nccl_ep.Algorithm.LOW_LATENCY, num_experts=32, num_topk=8,
        max_dispatch_tokens_per_rank=128, max_token_bytes=7168 * 2))
    handle = group.create_handle(nccl_ep.Layout.EXPERT_MAJOR, topk_idx)
    handle.dispatch(nccl_ep.DispatchInputs(tokens=x, topk_weights=w), nccl_ep.DispatchOutputs(tokens=recv),
                    layout_info=nccl_ep.LayoutInfo(expert_counters=counts))
    # expert_out: the experts' outputs for the first counts[l] rows of recv[l], laid out as recv
    expert_out = np.zeros_like(recv)
    for l in range(L):
        expert_out[l, :counts[l]] = to_bf16(from_bf16(recv[l, :counts[l]]) * scale(rank * L + l))
    handle.combine(nccl_ep.CombineInputs(tokens=expert_out), nccl_ep.CombineOutputs(tokens=out))
    handle.destroy(); group.destroy()
    return check("LL", out, x, topk_idx, w)


def ht_round(nranks, rank):
    """docs/capi.md's round: high throughput, flat."""
    T, hidden, L = 200, 1024, 8
    x, topk_idx, w = inputs(rank, T, hidden, 8 * nranks)
    out = np.zeros((T, hidden), np.uint16)

    def experts(rows, recv_idx, recv_w):
        """Each received row times the weighted scales of its experts here (local ids; -1 and
        weight 0 for the others)."""
        idx, wts = recv_idx[:len(rows)], recv_w[:len(rows)]
        factor = np.where(idx >= 0, wts * scale(rank * L + np.maximum(idx, 0)), 0).sum(axis=1, keepdims=True)
        return to_bf16(from_bf16(rows) * factor)

    group = nccl_ep.Group.create(MPI.COMM_WORLD, nccl_ep.GroupConfig(
        algorithm=nccl_ep.Algorithm.HIGH_THROUGHPUT, num_experts=8 * nranks,
        max_dispatch_tokens_per_rank=4096, max_token_bytes=hidden * 2, num_topk=8))
    handle = group.create_handle(nccl_ep.Layout.FLAT, topk_idx)       # [T, 8] int32 or int64
    slots = nranks * 4096
    recv = np.zeros((slots, hidden), np.uint16)                       # bfloat16 bits
    recv_w = np.zeros((slots, 8), np.float32)
    recv_idx = np.zeros((slots, 8), np.int64)
    total = np.zeros(1, np.int32)
    handle.dispatch(nccl_ep.DispatchInputs(tokens=x, topk_weights=w),
                    nccl_ep.DispatchOutputs(tokens=recv, topk_weights=recv_w, topk_idx=recv_idx),
                    layout_info=nccl_ep.LayoutInfo(recv_total_counter=total), stream=None)
    y = experts(recv[:total[0]], recv_idx, recv_w)                   # HT: the experts apply the weights
    handle.combine(nccl_ep.CombineInputs(tokens=y), nccl_ep.CombineOutputs(tokens=out))
    handle.complete()                 # a no-op unless a call was send_only
    handle.destroy(); group.destroy()
    return check("HT", out, x, topk_idx, w)


def main():
    comm = MPI.COMM_WORLD
    nranks, rank = comm.Get_size(), comm.Get_rank()
    errors = ll_round(nranks, rank) + ht_round(nranks, rank)
    for e in errors:
        print(f"readme.py: rank {rank}: {e}", file=sys.stderr)
    if comm.allreduce(len(errors), op=MPI.SUM):
        return 1
    if rank == 0:
        print(f"readme.py: LL and HT on {nranks} ranks: combined values right")
    return 0


if __name__ == "__main__":
    sys.exit(main())
