"""A rank that stalls becomes an error on the others (NcclTimeout, a
TimeoutError naming it), never a hang; with enable_mask the others mask it
and go on, and it rejoins with mask_clean. The stalled rank sleeps instead of
calling, then meets the others again."""

import time

import numpy as np
import pytest

import ep_reference as ref
import goep.ep as nccl_ep

pytestmark = pytest.mark.multirank

# The group's timeout, and how long the stalled rank sleeps: well past it. Not
# shorter: every collective of the group, its destroy included, waits at most
# the timeout for a peer, and on this shared machine a rank may lag by that much.
TIMEOUT_NS = 2 * 10**9
STALL_S = 3.5


def make(comm, **kw):
    R = comm.Get_size()
    s = ref.Shape(nranks=R, num_experts=4 * R, topk=2, hidden=16, max_tokens=6)
    cfg = nccl_ep.GroupConfig(algorithm=nccl_ep.Algorithm.LOW_LATENCY, num_experts=s.num_experts,
                              max_dispatch_tokens_per_rank=s.max_tokens, max_token_bytes=s.hidden * 2, num_topk=s.topk,
                              timeout_ns=TIMEOUT_NS, **kw)
    return s, cfg


def round_trip(comm, group, s):
    """A dispatch and combine with identity experts; returns the output as float32."""
    me, R = comm.Get_rank(), comm.Get_size()
    T = s.tokens_of(me)
    handle = group.create_handle(nccl_ep.Layout.EXPERT_MAJOR, ref.experts(s, me))
    recv = np.zeros((s.local_experts, R * s.max_tokens, s.hidden), dtype=np.uint16)
    counts = np.zeros(s.local_experts, dtype=np.int32)
    try:
        handle.dispatch(nccl_ep.DispatchInputs(tokens=ref.to_bf16(ref.values(me, T, s.hidden)),
                                               topk_weights=ref.weights(T, s.topk)),
                        nccl_ep.DispatchOutputs(tokens=recv), layout_info=nccl_ep.LayoutInfo(expert_counters=counts))
        out = np.zeros((T, s.hidden), dtype=np.uint16)
        handle.combine(nccl_ep.CombineInputs(tokens=recv), nccl_ep.CombineOutputs(tokens=out))
        return ref.from_bf16(out)
    finally:
        handle.destroy()


def test_stalled_rank_is_a_timeout_error(comm):
    s, cfg = make(comm)
    me, victim = comm.Get_rank(), comm.Get_size() - 1
    group = nccl_ep.Group.create(comm, cfg)
    if me != victim:
        start = time.monotonic()
        with pytest.raises(nccl_ep.NcclTimeout) as e:
            round_trip(comm, group, s)
        assert isinstance(e.value, TimeoutError)
        assert e.value.status == nccl_ep.Result.Timeout
        assert f"rank {victim}" in str(e.value)
        assert time.monotonic() - start < 10
    else:
        time.sleep(STALL_S)  # stalled well past the others' timeout
    comm.Barrier()  # everybody meets again before the collective destroy
    group.destroy()


def test_missing_rank_at_create_is_a_timeout_error(comm):
    s, cfg = make(comm)
    me, victim = comm.Get_rank(), comm.Get_size() - 1
    if me != victim:
        with pytest.raises(nccl_ep.NcclTimeout, match=f"rank {victim}"):
            nccl_ep.Group.create(comm, cfg)
    else:
        time.sleep(STALL_S)
    comm.Barrier()


def test_masked_rank_rejoins(comm):
    s, cfg = make(comm, enable_mask=True)
    me, victim = comm.Get_rank(), comm.Get_size() - 1
    with nccl_ep.Group.create(comm, cfg) as group:
        np.testing.assert_array_equal(round_trip(comm, group, s), ref.combined(s, me))
        assert group.get_async_error() == 0
        if me == victim:
            time.sleep(STALL_S)  # stalls: the others mask it and go on
            with pytest.raises(nccl_ep.NcclMasked, match="masked"):
                round_trip(comm, group, s)
            comm.Barrier()
        else:
            np.testing.assert_array_equal(round_trip(comm, group, s), ref.combined(s, me, masked=[victim]))
            assert group.get_async_error() == 1
            want = np.ones(comm.Get_size(), dtype=np.intc)
            want[victim] = 0
            np.testing.assert_array_equal(group.mask_query(), want)
            group.error_clear()
            assert group.get_async_error() == 0
            comm.Barrier()
        group.mask_clean()  # every rank, the stalled one back with them
        np.testing.assert_array_equal(group.mask_query(), np.ones(comm.Get_size(), dtype=np.intc))
        np.testing.assert_array_equal(round_trip(comm, group, s), ref.combined(s, me))
