#!/usr/bin/env python3
"""The cost of the Python boundary: the same round timed through goep.ep and in
Go inside the library (goepEpBenchGoRounds), on the same group, alternately,
in one run (the C side: capi/bench/ep_bench_capi.c).

  Python: create_handle(topk), dispatch into numpy arrays, combine of those
          arrays as the expert outputs (an identity expert), handle.destroy()
  Python zero-copy: the same, the rows left in the group's buffer and combined
          from there (DispatchOutputs(tokens=None), handle.recv_tokens())
  Go:     g.Dispatch(x, topk, weights), g.Combine(h, h.Recv(), out)
  Go with copies: the same, the rows received copied into a buffer of the
          library's and combined from there (goepEpBenchGoCopiedRounds): the
          copies the Python round makes, without the boundary

    mpirun -np 2 python3 python/bench/bench_boundary.py -m ll -t 128 [-d 7168] [-k 8] [-e 256] [-i 200] [-r 5]

Each timed round starts after a barrier. Prints one JSON line per interface
(rank 0): the slowest rank's median round in microseconds, its minimum, and
the Python round over the Go round (vs_go) and over the Go round with copies
(vs_go_copies).
"""

import argparse
import ctypes
import json
import os
import sys
import time

import numpy as np
from mpi4py import MPI

import goep.ep as nccl_ep
from goep.ep import _lib


def main() -> None:
    comm = MPI.COMM_WORLD
    me, R = comm.Get_rank(), comm.Get_size()
    p = argparse.ArgumentParser()
    p.add_argument("-m", default="ll", choices=["ll", "ht"])
    p.add_argument("-t", type=int, default=128)
    p.add_argument("-d", type=int, default=7168)
    p.add_argument("-k", type=int, default=8)
    p.add_argument("-e", type=int, default=256)
    p.add_argument("-i", type=int, default=200)
    p.add_argument("-r", type=int, default=5)
    a = p.parse_args()
    T, H, K, E, ll = a.t, a.d, a.k, a.e, a.m == "ll"
    L = E // R
    group = nccl_ep.Group.create(comm, nccl_ep.GroupConfig(
        algorithm=nccl_ep.Algorithm.LOW_LATENCY if ll else nccl_ep.Algorithm.HIGH_THROUGHPUT, num_experts=E,
        max_dispatch_tokens_per_rank=T, max_token_bytes=2 * H, num_topk=K, datatype=nccl_ep.BFLOAT16))
    # The C benchmark's inputs: K distinct experts per token, spread over the ranks.
    t = np.arange(T)[:, None]
    k = np.arange(K)[None, :]
    topk = ((me * 5 + t * 3 + k * max(E // K, 1)) % E).astype(np.int32)
    w = np.array([1.0, 0.5, 0.25, 0.125], dtype=np.float32)[(t + k) % 4]
    x = (((me * 7 + t * 3 + np.arange(H)[None, :]) % 17) + 0x3F00).astype(np.uint16)
    rows = L * R * T if ll else R * T
    recv = np.zeros((L, R * T, H) if ll else (rows, H), dtype=np.uint16)
    recv_w = np.zeros((rows, K), dtype=np.float32)
    recv_idx = np.zeros((rows, K), dtype=np.int32)
    counts = np.zeros(L, dtype=np.int32)
    out = np.zeros((T, H), dtype=np.uint16)
    layout = nccl_ep.Layout.EXPERT_MAJOR if ll else nccl_ep.Layout.FLAT
    dout = nccl_ep.DispatchOutputs(tokens=recv) if ll else nccl_ep.DispatchOutputs(tokens=recv, topk_weights=recv_w,
                                                                                   topk_idx=recv_idx)

    def python_round() -> float:
        comm.Barrier()
        t0 = time.perf_counter()
        h = group.create_handle(layout, topk)
        h.dispatch(nccl_ep.DispatchInputs(tokens=x, topk_weights=w), dout,
                   layout_info=nccl_ep.LayoutInfo(expert_counters=counts))
        h.combine(nccl_ep.CombineInputs(tokens=recv), nccl_ep.CombineOutputs(tokens=out))
        h.destroy()
        return (time.perf_counter() - t0) * 1e6

    dout_zc = nccl_ep.DispatchOutputs(tokens=None, topk_weights=dout.topk_weights, topk_idx=dout.topk_idx)

    def python_zero_copy_round() -> float:
        comm.Barrier()
        t0 = time.perf_counter()
        h = group.create_handle(layout, topk)
        h.dispatch(nccl_ep.DispatchInputs(tokens=x, topk_weights=w), dout_zc,
                   layout_info=nccl_ep.LayoutInfo(expert_counters=counts))
        h.combine(nccl_ep.CombineInputs(tokens=h.recv_tokens()), nccl_ep.CombineOutputs(tokens=out))
        h.destroy()
        return (time.perf_counter() - t0) * 1e6

    def go_rounds(n: int, fn: str = "goepEpBenchGoRounds") -> list[float]:
        us = (ctypes.c_double * n)()
        _lib.call(fn, group.ptr, x.ctypes.data, topk.ctypes.data, w.ctypes.data, T, n, us)
        return list(us)

    py_us, zc_us, go_us, gocp_us = [], [], [], []
    for rep in range(-1, a.r):  # rep -1 warms them up
        n = min(a.i, 5) if rep < 0 else a.i
        g = go_rounds(n)
        gc = go_rounds(n, "goepEpBenchGoCopiedRounds")
        p_ = [python_round() for _ in range(n)]
        z = [python_zero_copy_round() for _ in range(n)]
        if rep >= 0:
            go_us += g
            gocp_us += gc
            py_us += p_
            zc_us += z

    def stats(us):
        mine = np.array([np.median(us), np.min(us)])
        allr = np.zeros_like(mine)
        comm.Allreduce(mine, allr, op=MPI.MAX)
        return allr

    go_med, go_min = stats(go_us)
    gocp_med, gocp_min = stats(gocp_us)
    py_med, py_min = stats(py_us)
    zc_med, zc_min = stats(zc_us)
    rpn = int(os.environ.get("GOEP_RANKS_PER_NODE", "0") or 0)
    nodes = -(-R // rpn) if rpn > 0 else 1
    if me == 0:
        base = dict(mode=a.m, ranks=R, nodes=nodes, tokens=T, hidden=H, topk=K, experts=E, dtype="bf16", iters=a.i * a.r)
        for api, med, mn in (("go", go_med, go_min), ("go-copies", gocp_med, gocp_min), ("python", py_med, py_min),
                             ("python-zero-copy", zc_med, zc_min)):
            print(json.dumps(dict(api=api, **base, round_us=round(med, 1), round_min_us=round(mn, 1),
                                  vs_go=round(med / go_med, 3), vs_go_copies=round(med / gocp_med, 3))))
        sys.stdout.flush()
    group.destroy()


if __name__ == "__main__":
    main()
