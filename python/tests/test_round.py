"""A full dispatch / expert / combine round through goep.ep, in both modes,
every send-only split and both element types, checked against the
reference of ep_reference.py (computed with numpy from the definition)."""

import numpy as np
import pytest

import ep_reference as ref
import goep.ep as nccl_ep

LL, HT = nccl_ep.Algorithm.LOW_LATENCY, nccl_ep.Algorithm.HIGH_THROUGHPUT


def shape(comm, tokens=12, hidden=40, topk=3, experts_per_rank=4):
    return ref.Shape(nranks=comm.Get_size(), num_experts=experts_per_rank * comm.Get_size(), topk=topk,
                     hidden=hidden, max_tokens=tokens)


def group_for(comm, s, algorithm, dtype=nccl_ep.BFLOAT16, **kw):
    size = 2 if dtype == nccl_ep.BFLOAT16 else 4
    cfg = nccl_ep.GroupConfig(algorithm=algorithm, num_experts=s.num_experts, max_dispatch_tokens_per_rank=s.max_tokens,
                              max_token_bytes=s.hidden * size, num_topk=s.topk, datatype=dtype, timeout_ns=30 * 10**9,
                              **kw)
    return nccl_ep.Group.create(comm, cfg)


def encode(f, dtype):
    return ref.to_bf16(f) if dtype == nccl_ep.BFLOAT16 else np.ascontiguousarray(f, dtype=np.float32)


def decode(a, dtype):
    return ref.from_bf16(a) if dtype == nccl_ep.BFLOAT16 else a


@pytest.mark.parametrize("dtype", [nccl_ep.BFLOAT16, nccl_ep.FLOAT32], ids=["bf16", "f32"])
@pytest.mark.parametrize("send", ["none", "dispatch", "combine", "both"])
@pytest.mark.parametrize("algorithm", [LL, HT], ids=["ll", "ht"])
def test_round_matches_reference(comm, algorithm, send, dtype):
    s = shape(comm)
    me, R = comm.Get_rank(), comm.Get_size()
    T, H, K, L = s.tokens_of(me), s.hidden, s.topk, s.local_experts
    ll = algorithm == LL
    np_dtype = np.uint16 if dtype == nccl_ep.BFLOAT16 else np.float32
    with group_for(comm, s, algorithm, dtype) as group:
        x = encode(ref.values(me, T, H), dtype)
        w = ref.weights(T, K)
        handle = group.create_handle(nccl_ep.Layout.EXPERT_MAJOR if ll else nccl_ep.Layout.FLAT,
                                     ref.experts(s, me).astype(np.int32))
        assert group.buffer_bytes > 0  # allocated by the group's first handle
        counts = np.full(L, -1, dtype=np.int64)
        total = np.full(1, -1, dtype=np.int64)
        if ll:
            recv = np.zeros((L, R * s.max_tokens, H), dtype=np_dtype)
            out_bundle = nccl_ep.DispatchOutputs(tokens=recv)
        else:
            slots = R * s.max_tokens
            recv = np.zeros((slots, H), dtype=np_dtype)
            recv_w = np.zeros((slots, K), dtype=np.float32)
            recv_idx = np.zeros((slots, K), dtype=np.int32)
            out_bundle = nccl_ep.DispatchOutputs(tokens=recv, topk_weights=recv_w, topk_idx=recv_idx)
        handle.dispatch(nccl_ep.DispatchInputs(tokens=x, topk_weights=w), out_bundle,
                        layout_info=nccl_ep.LayoutInfo(expert_counters=counts, recv_total_counter=total),
                        config=nccl_ep.DispatchConfig(send_only=int(send in ("dispatch", "both"))))
        handle.complete()
        if ll:
            want = ref.received_ll(s, me)
            assert list(counts) == [len(r) for r in want]
            assert total[0] == sum(len(r) for r in want)
            for l, rows in enumerate(want):
                for j, (src, t) in enumerate(rows):
                    np.testing.assert_array_equal(decode(recv[l, j], dtype), ref.values(src, t + 1, H)[t],
                                                  err_msg=f"expert {l} row {j} (rank {src} token {t})")
            y = recv
        else:
            want = ref.received_ht(s, me)
            n = len(want)
            assert total[0] == n
            for j, (src, t, ids, wt) in enumerate(want):
                np.testing.assert_array_equal(decode(recv[j], dtype), ref.values(src, t + 1, H)[t],
                                              err_msg=f"row {j} (rank {src} token {t})")
                np.testing.assert_array_equal(recv_idx[j], ids, err_msg=f"row {j} local expert ids")
                np.testing.assert_array_equal(recv_w[j], wt, err_msg=f"row {j} weights")
            assert list(counts) == [sum(int((ids == l).sum()) for _, _, ids, _ in want) for l in range(L)]
            y = np.zeros_like(recv)  # the experts apply the weights in HT
            y[:n] = encode(decode(recv[:n], dtype) * recv_w[:n].sum(axis=1, keepdims=True), dtype)
        out = np.zeros((T, H), dtype=np_dtype)
        handle.combine(nccl_ep.CombineInputs(tokens=y),
                       nccl_ep.CombineOutputs(tokens=out, topk_weights=w if ll else None),
                       config=nccl_ep.CombineConfig(send_only=int(send in ("combine", "both"))))
        handle.complete()
        np.testing.assert_array_equal(decode(out, dtype), ref.combined(s, me))
        handle.destroy()


def test_ht_global_ids_and_slot_values(comm):
    """recv_topk_idx_kind GLOBAL numbers the received ids as the experts' own;
    values per received (row, slot) come back summed to each token's slot:
    the gate weights themselves, since only their expert's rank has them."""
    s = shape(comm)
    me, R = comm.Get_rank(), comm.Get_size()
    T, H, K, L = s.tokens_of(me), s.hidden, s.topk, s.local_experts
    with group_for(comm, s, HT) as group:
        handle = group.create_handle(nccl_ep.Layout.FLAT, ref.experts(s, me))
        slots = R * s.max_tokens
        recv = np.zeros((slots, H), dtype=np.uint16)
        recv_w = np.zeros((slots, K), dtype=np.float32)
        recv_idx = np.zeros((slots, K), dtype=np.int64)
        total = np.zeros(1, dtype=np.int32)
        w = ref.weights(T, K)
        handle.dispatch(nccl_ep.DispatchInputs(tokens=ref.to_bf16(ref.values(me, T, H)), topk_weights=w),
                        nccl_ep.DispatchOutputs(tokens=recv, topk_weights=recv_w, topk_idx=recv_idx),
                        layout_info=nccl_ep.LayoutInfo(recv_total_counter=total,
                                                       recv_topk_idx_kind=nccl_ep.ExpertIdKind.GLOBAL))
        want = ref.received_ht(s, me)
        for j, (_, _, ids, _) in enumerate(want):
            np.testing.assert_array_equal(recv_idx[j], np.where(ids >= 0, ids + me * L, -1))
        out = np.zeros((T, H), dtype=np.uint16)
        slot_sums = np.full((T, K), -1, dtype=np.float32)
        handle.combine(nccl_ep.CombineInputs(tokens=recv, topk_weights=recv_w),
                       nccl_ep.CombineOutputs(tokens=out, topk_weights=slot_sums),
                       config=nccl_ep.CombineConfig(pass_direction=nccl_ep.PassDir.BWD))
        e = ref.experts(s, me)
        np.testing.assert_array_equal(slot_sums, np.where(e >= 0, w, 0))
        # Unweighted rows summed over the ranks each token went to.
        ranks_hit = np.array([len({int(x) // L for x in row if x >= 0}) for row in e], dtype=np.float32)
        np.testing.assert_array_equal(ref.from_bf16(out), ref.values(me, T, H) * ranks_hit[:, None])
        handle.destroy()


@pytest.mark.parametrize("algorithm", [LL, HT], ids=["ll", "ht"])
def test_zero_copy_round(comm, algorithm):
    """Dispatch without outputs->tokens: the rows are read, and overwritten by
    the experts, in place in the group's buffer (recv_tokens), and combined
    from there; the result is the reference's."""
    s = shape(comm)
    me, R = comm.Get_rank(), comm.Get_size()
    T, H, K, L = s.tokens_of(me), s.hidden, s.topk, s.local_experts
    ll = algorithm == LL
    with group_for(comm, s, algorithm) as group:
        handle = group.create_handle(nccl_ep.Layout.EXPERT_MAJOR if ll else nccl_ep.Layout.FLAT, ref.experts(s, me))
        counts = np.zeros(L, dtype=np.int32)
        recv_w = np.zeros((R * s.max_tokens, K), dtype=np.float32)
        w = ref.weights(T, K)
        handle.dispatch(nccl_ep.DispatchInputs(tokens=ref.to_bf16(ref.values(me, T, H)), topk_weights=w),
                        nccl_ep.DispatchOutputs(tokens=None, topk_weights=None if ll else recv_w),
                        layout_info=nccl_ep.LayoutInfo(expert_counters=counts))
        rows = handle.recv_tokens()
        if ll:
            assert rows.shape == (L, R * s.max_tokens, H) and rows.dtype == np.uint16
            for l, want in enumerate(ref.received_ll(s, me)):
                assert counts[l] == len(want)
                for j, (src, t) in enumerate(want):
                    np.testing.assert_array_equal(ref.from_bf16(rows[l, j]), ref.values(src, t + 1, H)[t])
        else:
            want = ref.received_ht(s, me)
            assert rows.shape == (len(want), H)
            for j, (src, t, _, _) in enumerate(want):
                np.testing.assert_array_equal(ref.from_bf16(rows[j]), ref.values(src, t + 1, H)[t])
            n = len(want)  # the experts, in place
            rows[:] = ref.to_bf16(ref.from_bf16(rows) * recv_w[:n].sum(axis=1, keepdims=True))
        out = np.zeros((T, H), dtype=np.uint16)
        handle.combine(nccl_ep.CombineInputs(tokens=rows), nccl_ep.CombineOutputs(tokens=out))
        np.testing.assert_array_equal(ref.from_bf16(out), ref.combined(s, me))
        handle.destroy()


def test_memory_queries(comm):
    s = shape(comm)
    cfg = nccl_ep.GroupConfig(algorithm=LL, num_experts=8, max_dispatch_tokens_per_rank=16, max_token_bytes=256,
                              num_topk=2)
    one, two = nccl_ep.buffer_plan(cfg, 4, 1), nccl_ep.buffer_plan(cfg, 4, 2)
    assert one.window_per_rank == 0 and two.window_per_rank > 0
    assert one.ranks_per_node == 4 and two.ranks_per_node == 2
    assert one.per_node == 4 * one.shared_per_rank
    with group_for(comm, s, LL) as group:
        assert group.handle_mem_size(nccl_ep.Layout.EXPERT_MAJOR, s.topk) == s.max_tokens * s.topk * 4
        with pytest.raises(nccl_ep.NcclInvalid, match="no handle has been made yet"):
            group.buffer_bytes
        group.create_handle(nccl_ep.Layout.EXPERT_MAJOR, ref.experts(s, comm.Get_rank()).astype(np.int32)).destroy()
        assert group.buffer_bytes >= nccl_ep.buffer_plan(group.config, comm.Get_size(), 1).shared_per_rank // 2


def test_version_and_path():
    assert nccl_ep.get_lib_version() == (0, 1, 0)
    assert nccl_ep.get_lib_path().name == "libgoep_ep.so"


def test_ll_num_topk_from_first_handle(comm):
    """num_topk 0, as nccl.ep allows: the group's first handle opens it with
    that handle's top-k, and the round gives the reference values."""
    s = shape(comm)
    me, R = comm.Get_rank(), comm.Get_size()
    T, H, K, L = s.tokens_of(me), s.hidden, s.topk, s.local_experts
    cfg = nccl_ep.GroupConfig(algorithm=LL, num_experts=s.num_experts, max_dispatch_tokens_per_rank=s.max_tokens,
                              max_token_bytes=H * 2, timeout_ns=30 * 10**9)
    with nccl_ep.Group.create(comm, cfg) as group:
        assert group.handle_mem_size(nccl_ep.Layout.EXPERT_MAJOR, num_topk=K) == s.max_tokens * K * 4
        handle = group.create_handle(nccl_ep.Layout.EXPERT_MAJOR, ref.experts(s, me).astype(np.int32))
        assert group.buffer_bytes > 0
        w = ref.weights(T, K)
        recv = np.zeros((L, R * s.max_tokens, H), dtype=np.uint16)
        counts = np.zeros(L, dtype=np.int64)
        handle.dispatch(nccl_ep.DispatchInputs(tokens=ref.to_bf16(ref.values(me, T, H)), topk_weights=w),
                        nccl_ep.DispatchOutputs(tokens=recv), layout_info=nccl_ep.LayoutInfo(expert_counters=counts))
        assert list(counts) == [len(r) for r in ref.received_ll(s, me)]
        out = np.zeros((T, H), dtype=np.uint16)
        handle.combine(nccl_ep.CombineInputs(tokens=recv), nccl_ep.CombineOutputs(tokens=out, topk_weights=w))
        np.testing.assert_array_equal(ref.from_bf16(out), ref.combined(s, me))
        handle.destroy()
