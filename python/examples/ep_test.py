#!/usr/bin/env python3
"""A full dispatch / expert / combine round through goep's Python interface,
checked against a reference this program computes (ep_reference.py), written
the way NCCL EP's ep_test.py uses ``nccl.ep``: only the import, the
communicator (mpi4py's, not an NCCL one) and the buffers (numpy arrays, not
device memory) differ.

    mpirun -np 4 python3 python/examples/ep_test.py [-a ll,ht] [-s none,both] [-c] [-t 24] [-d 64]

Exits non-zero on any rank's mismatch.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ep_reference as ref  # noqa: E402

import goep.ep as nccl_ep  # noqa: E402


def run_round(comm, group, s: ref.Shape, algorithm, send_dispatch: bool, send_combine: bool, cached: bool) -> list[str]:
    """One round; returns this rank's mismatches."""
    me, R = comm.Get_rank(), comm.Get_size()
    T, H, K, L = s.tokens_of(me), s.hidden, s.topk, s.local_experts
    ll = algorithm == nccl_ep.Algorithm.LOW_LATENCY
    slots = R * s.max_tokens
    errors: list[str] = []

    x = ref.to_bf16(ref.values(me, T, H))  # bfloat16 tokens as uint16 bits
    topk_idx = ref.experts(s, me)
    topk_weights = ref.weights(T, K)
    handle = group.create_handle(nccl_ep.Layout.EXPERT_MAJOR if ll else nccl_ep.Layout.FLAT, topk_idx,
                                 config=nccl_ep.HandleConfig(), stream=None)

    counts = np.full(L, -1, dtype=np.int32)
    total = np.full(1, -1, dtype=np.int32)
    if ll:
        recv = np.zeros((L, R * s.max_tokens, H), dtype=np.uint16)
        outputs = nccl_ep.DispatchOutputs(tokens=recv)
    else:
        recv = np.zeros((slots, H), dtype=np.uint16)
        recv_w = np.zeros((slots, K), dtype=np.float32)
        recv_idx = np.zeros((slots, K), dtype=np.int64)
        outputs = nccl_ep.DispatchOutputs(tokens=recv, topk_weights=recv_w, topk_idx=recv_idx)
    layout_info = nccl_ep.LayoutInfo(expert_counters=counts, recv_total_counter=total)
    handle.dispatch(nccl_ep.DispatchInputs(tokens=x, topk_weights=topk_weights), outputs, layout_info=layout_info,
                    config=nccl_ep.DispatchConfig(send_only=int(send_dispatch)), stream=None)
    handle.complete(stream=None)

    # The dispatch against the reference.
    if ll:
        want = ref.received_ll(s, me)
        for l in range(L):
            if counts[l] != len(want[l]):
                errors.append(f"expert_counters[{l}] = {counts[l]}, want {len(want[l])}")
                continue
            for j, (src, t) in enumerate(want[l]):
                if not np.array_equal(recv[l, j], ref.to_bf16(ref.values(src, t + 1, H)[t])):
                    errors.append(f"expert {l} row {j} (rank {src} token {t}) differs")
        if total[0] != sum(len(w) for w in want):
            errors.append(f"recv_total_counter = {total[0]}, want {sum(len(w) for w in want)}")
    else:
        want = ref.received_ht(s, me)
        if total[0] != len(want):
            errors.append(f"recv_total_counter = {total[0]}, want {len(want)}")
        for j, (src, t, ids, w) in enumerate(want[: total[0]]):
            if not np.array_equal(recv[j], ref.to_bf16(ref.values(src, t + 1, H)[t])):
                errors.append(f"row {j} (rank {src} token {t}) differs")
            if not np.array_equal(recv_idx[j], ids) or not np.array_equal(recv_w[j], w):
                errors.append(f"row {j}: topk_idx {recv_idx[j]}, weights {recv_w[j]}; want {ids}, {w}")
        want_counts = np.zeros(L, dtype=np.int32)
        for _, _, ids, _ in want:
            for i in ids[ids >= 0]:
                want_counts[i] += 1
        if not np.array_equal(counts, want_counts):
            errors.append(f"expert_counters = {counts}, want {want_counts}")

    # The experts: LL, the identity on the received rows in place; HT, each row
    # times its weights (the expert side applies them in HT).
    if ll:
        expert_out = recv
    else:
        n = int(total[0])
        expert_out = np.zeros_like(recv)
        expert_out[:n] = ref.to_bf16(ref.from_bf16(recv[:n]) * recv_w[:n].sum(axis=1, keepdims=True))
    out = np.zeros((T, H), dtype=np.uint16)
    handle.combine(nccl_ep.CombineInputs(tokens=expert_out),
                   nccl_ep.CombineOutputs(tokens=out, topk_weights=topk_weights if ll else None),
                   config=nccl_ep.CombineConfig(send_only=int(send_combine)), stream=None)
    handle.complete(stream=None)
    want_out = ref.to_bf16(ref.combined(s, me))
    bad = np.argwhere(out != want_out)
    if len(bad):
        t, h = bad[0]
        errors.append(f"combined token {t} [{h}] = {float(ref.from_bf16(out[t:t+1, h])[0])}, want {float(ref.from_bf16(want_out[t:t+1, h])[0])} "
                      f"({len(bad)} elements differ)")

    if cached:
        # The same handle again: tokens only (the routing and weights are the
        # handle's); the same bytes must come out.
        recv2 = np.zeros_like(recv)
        handle.dispatch(nccl_ep.DispatchInputs(tokens=x), nccl_ep.DispatchOutputs(tokens=recv2),
                        layout_info=nccl_ep.LayoutInfo(expert_counters=counts) if ll else None)
        handle.complete()
        n = int(total[0])
        same = all(np.array_equal(recv2[l, : counts[l]], recv[l, : counts[l]]) for l in range(L)) if ll else \
            np.array_equal(recv2[:n], recv[:n])
        if not same:
            errors.append("cached dispatch: the rows differ from the first dispatch's")
        out2 = np.zeros_like(out)
        handle.combine(nccl_ep.CombineInputs(tokens=recv2 if ll else expert_out), nccl_ep.CombineOutputs(tokens=out2))
        handle.complete()
        if not np.array_equal(out2, out):
            errors.append("cached combine: the output differs from the first combine's")
    handle.destroy()
    return errors


def main() -> int:
    comm = MPI.COMM_WORLD
    me, R = comm.Get_rank(), comm.Get_size()
    p = argparse.ArgumentParser(description="goep.ep round test")
    p.add_argument("-a", default="ll,ht", help="algorithms: ll, ht (comma-separated)")
    p.add_argument("-s", default="none,both", help="send-only modes: none, dispatch, combine, both")
    p.add_argument("-c", action="store_true", help="repeat each round with the same handle (cached)")
    p.add_argument("-t", type=int, default=24, help="tokens per rank (at most)")
    p.add_argument("-d", type=int, default=64, help="hidden size")
    p.add_argument("-k", type=int, default=4, help="top-k")
    p.add_argument("-e", type=int, default=8, help="experts per rank")
    args = p.parse_args()
    s = ref.Shape(nranks=R, num_experts=args.e * R, topk=args.k, hidden=args.d, max_tokens=args.t)
    if me == 0:
        print(f"ep_test.py: goep.ep from {os.path.dirname(nccl_ep.__file__)}, library {nccl_ep.get_lib_path()}")

    failed = False
    for name, algorithm in (("ll", nccl_ep.Algorithm.LOW_LATENCY), ("ht", nccl_ep.Algorithm.HIGH_THROUGHPUT)):
        if name not in args.a.split(","):
            continue
        config = nccl_ep.GroupConfig(
            algorithm=algorithm,
            num_experts=s.num_experts,
            max_dispatch_tokens_per_rank=s.max_tokens,
            max_token_bytes=s.hidden * 2,  # bfloat16
            num_topk=s.topk,
            datatype=nccl_ep.BFLOAT16,
            timeout_ns=30 * 10**9,
        )
        group = nccl_ep.Group.create(comm, config)
        for mode in args.s.split(","):
            sd, sc = mode in ("dispatch", "both"), mode in ("combine", "both")
            errors = run_round(comm, group, s, algorithm, sd, sc, args.c)
            for e in errors[:5]:
                print(f"rank {me}: {name} send-only={mode}: {e}", file=sys.stderr)
            any_bad = comm.allreduce(bool(errors), op=MPI.LOR)
            failed |= any_bad
            if me == 0:
                label = f"{name} bf16 send-only={mode}{' cached' if args.c else ''}"
                print(f"ep_test.py: {label:<40} {R} ranks: {'FAILED' if any_bad else 'ok'}", flush=True)
        group.destroy()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
