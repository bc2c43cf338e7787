"""Handle.update and Group.init_handle: one handle for a loop of steps, each
step's routing given by update. Each step routes differently (a step-dependent
slot of some tokens set to -1) and its experts scale by the step's factor, so
a combine that used another step's routing or pairing gives other values.
The expected values are computed here from ep_reference's tokens and weights,
not by the library."""

import numpy as np
import pytest

import ep_reference as ref
import goep.ep as nccl_ep
from test_sequences import LL, HT, Steps

pytestmark = pytest.mark.multirank


def routing(st, step):
    """Step `step`'s top-k ids: ep_reference's, with slot step % K of every
    other token (by step's parity) dropped."""
    e = ref.experts(st.s, st.me).copy()
    t = np.arange(st.T)
    e[(t % 2) == (step % 2), step % st.s.topk] = -1
    return e


def expected(st, topk, factor):
    """The combine of identity experts scaled by factor: each token times the
    sum of the weights of its routed slots, times factor."""
    keep = topk >= 0
    acc = np.zeros((st.T, st.s.hidden), dtype=np.float32)
    for k in range(st.s.topk):  # slot order, as the combine accumulates
        acc += np.where(keep[:, k : k + 1], st.w[:, k : k + 1], np.float32(0)) * ref.values(st.me, st.T, st.s.hidden)
    return acc * np.float32(factor)


def layout(st):
    return nccl_ep.Layout.EXPERT_MAJOR if st.ll else nccl_ep.Layout.FLAT


def step(st, h, i, factor):
    """Update h to step i's routing, dispatch, combine and check the values."""
    topk = routing(st, i)
    h.update(topk)
    st.dispatch(h)
    st.combine(h, factor)
    np.testing.assert_array_equal(ref.from_bf16(st.out), expected(st, topk, factor),
                                  err_msg=f"rank {st.me}: step {i} after update (factor {factor})")


@pytest.fixture
def steps(comm, request):
    st = Steps(comm, request.param)
    yield st
    if st.group._ptr:
        st.group.destroy()


STEPS = pytest.mark.parametrize("steps", [LL, HT], ids=["ll", "ht"], indirect=True)


@STEPS
@pytest.mark.parametrize("mem", ["library", "handle_mem"])
def test_update_rounds_give_reference_values(steps, mem):
    """init_handle once, then per step update, dispatch, combine: each step's
    values are its own routing's, in the library's memory or the caller's."""
    st = steps
    hm = None
    if mem == "handle_mem":
        n = st.group.handle_mem_size(layout(st), st.s.topk)
        assert n >= st.s.max_tokens * st.s.topk * 4, n
        hm = np.zeros(n, dtype=np.uint8)
    h = st.group.init_handle(layout(st), st.s.topk, handle_mem=hm)
    try:
        for i, factor in enumerate((1, 2, 4, 8)):
            step(st, h, i, factor)
        if hm is not None:  # the routing lives in handle_mem: the last step's ids are there
            last = routing(st, 3)
            ids = hm[: last.size * 4].view(np.int32).reshape(last.shape)
            np.testing.assert_array_equal(ids, last.astype(np.int32))
    finally:
        h.destroy()


def test_init_handle_refuses_a_small_handle_mem(comm):
    st = Steps(comm, LL)
    try:
        with pytest.raises(nccl_ep.NcclInvalid, match="handle_mem has 4 bytes"):
            st.group.init_handle(layout(st), st.s.topk, handle_mem=np.zeros(4, dtype=np.uint8))
        with pytest.raises(nccl_ep.NcclInvalid, match=f"num_topk = {st.s.topk + 1}"):
            st.group.init_handle(layout(st), st.s.topk + 1)
    finally:
        st.group.destroy()


BAD_TOPK = {
    "expert id out of range": (lambda st: np.full((st.T, st.s.topk), st.s.num_experts, dtype=np.int64),
                               "is not an expert id"),
    "not C-contiguous": (lambda st: np.asfortranarray(np.stack([ref.experts(st.s, st.me)] * 2, axis=2)[:, :, 0]),
                         "is not C-contiguous"),
}


@STEPS
@pytest.mark.parametrize("bad_topk", BAD_TOPK.keys())
def test_bad_update_fails_the_step_everywhere(steps, bad_topk):
    """One rank's update is refused (by the library, or by this package) and
    it goes on to its next step: every other rank's dispatch of that step
    fails at once naming it, and every rank's later steps give their values."""
    st = steps
    h = st.group.init_handle(layout(st), st.s.topk)
    try:
        step(st, h, 0, 1)
        make, reason = BAD_TOPK[bad_topk]
        if st.me == st.bad:
            with pytest.raises(nccl_ep.NcclInvalid, match=reason):
                h.update(make(st))
        else:
            h.update(routing(st, 1))
            with pytest.raises(nccl_ep.NCCLError) as e:
                st.dispatch(h)
            st.refused_by_bad(e.value, reason)
        for i, factor in ((2, 2), (3, 4), (4, 8)):
            step(st, h, i, factor)
    finally:
        h.destroy()


def test_update_of_an_uncombined_ll_dispatch_is_refused(comm):
    """An LL handle's dispatch holds the buffers its combine reads: an update
    before that combine is refused (on every rank here, each updating early),
    the pending combine still gives its step's values, and the step the
    refused update stood for fails on every rank; then the loop goes on."""
    st = Steps(comm, LL)
    h = st.group.init_handle(layout(st), st.s.topk)
    try:
        topk = routing(st, 0)
        h.update(topk)
        st.dispatch(h)
        with pytest.raises(nccl_ep.NcclInvalid, match="has not been combined"):
            h.update(routing(st, 1))
        st.combine(h, 2)
        np.testing.assert_array_equal(ref.from_bf16(st.out), expected(st, topk, 2),
                                      err_msg=f"rank {st.me}: the combine after the refused update")
        with pytest.raises(nccl_ep.NCCLError, match="refused"):
            st.dispatch(h)
        for i, factor in ((1, 4), (2, 8)):
            step(st, h, i, factor)
    finally:
        h.destroy()
        st.group.destroy()


@STEPS
def test_dispatch_after_a_refused_update_is_refused(steps):
    """Every rank's update is refused here, by this package (topk_idx is not
    C-contiguous): the step it stood for fails on every rank, and so does a
    dispatch of the handle without a new update, which would otherwise move
    the rows with the routing of the step before; after an update the loop
    goes on with its values."""
    st = steps
    h = st.group.init_handle(layout(st), st.s.topk)
    try:
        step(st, h, 0, 1)
        make, reason = BAD_TOPK["not C-contiguous"]
        with pytest.raises(nccl_ep.NcclInvalid, match=reason):
            h.update(make(st))
        with pytest.raises(nccl_ep.NCCLError, match="refused"):
            st.dispatch(h)
        with pytest.raises(nccl_ep.NCCLError, match="has no routing"):
            st.dispatch(h)
        for i, factor in ((1, 2), (2, 4)):
            step(st, h, i, factor)
    finally:
        h.destroy()
