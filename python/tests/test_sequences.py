"""One rank's refusal never shifts a result to another step: the sequences of
issue reports that once paired one rank's step with another's, each checked
for the error on every rank (naming the rank) and for the combined values of
the steps after it, in both modes.

Each step's experts scale their rows by the step's own factor (1, 2, 4, ...:
exact in bfloat16), so a combine paired with another rank's step would give
values of the wrong factor, not only of another routing.
"""

import numpy as np
import pytest

import ep_reference as ref
import goep.ep as nccl_ep

pytestmark = pytest.mark.multirank

LL, HT = nccl_ep.Algorithm.LOW_LATENCY, nccl_ep.Algorithm.HIGH_THROUGHPUT
MODES = pytest.mark.parametrize("algorithm", [LL, HT], ids=["ll", "ht"])


class Steps:
    """A group and the steps of a decode or training loop over it: create a
    handle, dispatch, run the step's experts, combine, destroy."""

    def __init__(self, comm, algorithm):
        self.comm, self.me, self.R = comm, comm.Get_rank(), comm.Get_size()
        self.bad = self.R - 1  # the rank whose input is bad
        self.ll = algorithm == LL
        self.s = ref.Shape(nranks=self.R, num_experts=4 * self.R, topk=2, hidden=16, max_tokens=6)
        s = self.s
        self.group = nccl_ep.Group.create(comm, nccl_ep.GroupConfig(
            algorithm=algorithm, num_experts=s.num_experts, max_dispatch_tokens_per_rank=s.max_tokens,
            max_token_bytes=s.hidden * 2, num_topk=s.topk, timeout_ns=60 * 10**9))
        self.T = s.tokens_of(self.me)
        self.x = ref.to_bf16(ref.values(self.me, self.T, s.hidden))
        self.w = ref.weights(self.T, s.topk)

    def handle(self, topk=None):
        layout = nccl_ep.Layout.EXPERT_MAJOR if self.ll else nccl_ep.Layout.FLAT
        return self.group.create_handle(layout, ref.experts(self.s, self.me) if topk is None else topk)

    def outputs(self):
        s, R = self.s, self.R
        if self.ll:
            self.recv = np.zeros((s.local_experts, R * s.max_tokens, s.hidden), dtype=np.uint16)
            self.recv_w = None
            return nccl_ep.DispatchOutputs(tokens=self.recv)
        self.recv = np.zeros((R * s.max_tokens, s.hidden), dtype=np.uint16)
        self.recv_w = np.zeros((R * s.max_tokens, s.topk), dtype=np.float32)
        return nccl_ep.DispatchOutputs(tokens=self.recv, topk_weights=self.recv_w)

    def dispatch(self, h, tokens=None, send_only=False):
        self.counts = np.zeros(self.s.local_experts, dtype=np.int32)
        self.total = np.zeros(1, dtype=np.int32)
        h.dispatch(nccl_ep.DispatchInputs(tokens=self.x if tokens is None else tokens, topk_weights=self.w),
                   self.outputs(), layout_info=nccl_ep.LayoutInfo(expert_counters=self.counts,
                                                                  recv_total_counter=self.total),
                   config=nccl_ep.DispatchConfig(send_only=int(send_only)))

    def experts(self, factor):
        """The step's experts: its factor times the row (HT: times the row's
        weights too, which HT experts apply)."""
        y = ref.from_bf16(self.recv) * np.float32(factor)
        if not self.ll:
            y = y * self.recv_w.sum(axis=1, keepdims=True)
        return ref.to_bf16(y)

    def combine(self, h, factor, out=None, send_only=False):
        self.out = np.zeros((self.T, self.s.hidden), dtype=np.uint16) if out is None else out
        h.combine(nccl_ep.CombineInputs(tokens=self.experts(factor)),
                  nccl_ep.CombineOutputs(tokens=self.out, topk_weights=self.w if self.ll else None),
                  config=nccl_ep.CombineConfig(send_only=int(send_only)))

    def check(self, factor, what):
        np.testing.assert_array_equal(ref.from_bf16(self.out), ref.combined(self.s, self.me) * np.float32(factor),
                                      err_msg=f"rank {self.me}: {what}: combined values of the step with factor {factor}")

    def round(self, factor, what):
        """A whole good step, checked."""
        h = self.handle()
        try:
            self.dispatch(h)
            self.combine(h, factor)
        finally:
            h.destroy()
        self.check(factor, what)

    def refused_by_bad(self, err, reason):
        """err, on a rank other than the bad one, names it and its reason."""
        assert isinstance(err, nccl_ep.NcclRemoteError), f"rank {self.me}: {err!r}"
        assert f"rank {self.bad} refused" in str(err), str(err)
        assert reason in str(err), str(err)


@pytest.fixture
def steps(comm, request):
    st = Steps(comm, request.param)
    yield st
    if st.group._ptr:
        st.group.destroy()


STEPS = pytest.mark.parametrize("steps", [LL, HT], ids=["ll", "ht"], indirect=True)
BAD_TOPK = {
    "expert id out of range": (lambda st: np.full((st.T, st.s.topk), st.s.num_experts, dtype=np.int64),
                               "is not an expert id"),
    "not C-contiguous": (lambda st: np.asfortranarray(np.stack([ref.experts(st.s, st.me)] * 2, axis=2)[:, :, 0]),
                         "is not C-contiguous"),
}


@STEPS
@pytest.mark.parametrize("bad_topk", BAD_TOPK.keys())
def test_create_handle_refused_fails_the_step_everywhere(steps, bad_topk):
    """Sequence 1: one rank's create_handle is refused (by the library: an
    expert id out of range; by this package: an array it cannot describe) and
    it goes on to the next step. Every other rank's dispatch of that step fails
    at once naming it; every rank's next steps combine right values."""
    st = steps
    st.round(1, "the step before")
    make, reason = BAD_TOPK[bad_topk]
    if st.me == st.bad:
        topk = make(st)
        if bad_topk == "not C-contiguous":
            assert not topk.flags.c_contiguous
        with pytest.raises(nccl_ep.NcclInvalid, match=reason):
            st.handle(topk)
    else:
        h = st.handle()
        try:
            with pytest.raises(nccl_ep.NCCLError) as e:
                st.dispatch(h)
            st.refused_by_bad(e.value, reason)
        finally:
            h.destroy()
    for factor in (2, 4, 8):
        st.round(factor, f"the step after the refused one (factor {factor})")


BAD_ARRAYS = {
    "tokens not C-contiguous": "inputs.tokens is not C-contiguous",
    "read-only outputs": "outputs.tokens is read-only",
}


@STEPS
@pytest.mark.parametrize("bad", BAD_ARRAYS.keys())
def test_dispatch_refused_by_python_fails_everywhere(steps, bad):
    """Sequence 1 again, refused by this package at dispatch: a token array
    that is not C-contiguous, or a read-only output array, on one rank."""
    st = steps
    h = st.handle()
    try:
        if st.me == st.bad:
            with pytest.raises(nccl_ep.NcclInvalid, match=BAD_ARRAYS[bad]):
                if bad == "tokens not C-contiguous":
                    st.dispatch(h, tokens=np.asfortranarray(np.stack([st.x, st.x], axis=2))[:, :, 0])
                else:
                    out = st.outputs()
                    out.tokens.setflags(write=False)
                    h.dispatch(nccl_ep.DispatchInputs(tokens=st.x, topk_weights=st.w), out,
                               layout_info=nccl_ep.LayoutInfo(expert_counters=np.zeros(st.s.local_experts, np.int32)))
        else:
            with pytest.raises(nccl_ep.NCCLError) as e:
                st.dispatch(h)
            st.refused_by_bad(e.value, BAD_ARRAYS[bad])
    finally:
        h.destroy()
    for factor in (2, 4, 8):
        st.round(factor, f"the step after the refused dispatch (factor {factor})")


@STEPS
def test_retry_after_a_refused_step_is_a_mismatch(steps):
    """After one rank's refused create_handle, the others retry their refused
    dispatch while that rank goes on to its next step: their calls no longer
    match, and every rank's call fails with NcclMismatch naming a rank, never
    with values of two different steps."""
    st = steps
    st.round(1, "the step before")
    if st.me == st.bad:
        with pytest.raises(nccl_ep.NcclInvalid):
            st.handle(np.full((st.T, st.s.topk), st.s.num_experts, dtype=np.int64))
        h = st.handle()  # its next step
    else:
        h = st.handle()
        with pytest.raises(nccl_ep.NcclRemoteError):
            st.dispatch(h)
    with pytest.raises(nccl_ep.NcclMismatch) as e:  # the others' retry; the bad rank's next step
        st.dispatch(h)
        st.combine(h, 2)
    assert "rank " in str(e.value) and "call " in str(e.value), str(e.value)
    with pytest.raises(nccl_ep.NcclMismatch):  # and the group stays unusable
        st.dispatch(st.handle())
    st.group.destroy()  # every rank is alive: the group closes as usual


@STEPS
def test_refused_combine_then_destroy_gives_buffers_back(steps):
    """Sequence 2: a dispatch, a combine refused on one rank (wrong output
    shape), the handle destroyed in a finally; LL's buffer set comes back, so
    the steps after (more than the two that may wait for their combine) go on
    with right values."""
    st = steps
    for step in range(3):
        h = st.handle()
        try:
            st.dispatch(h)
            if st.me == st.bad:
                with pytest.raises(nccl_ep.NcclInvalid, match="outputs->tokens has shape"):
                    st.combine(h, 1, out=np.zeros((st.T + 1, st.s.hidden), dtype=np.uint16))
            else:
                with pytest.raises(nccl_ep.NCCLError) as e:
                    st.combine(h, 1)
                st.refused_by_bad(e.value, "outputs->tokens has shape")
        finally:
            h.destroy()
    for factor in (2, 4, 8, 16):
        st.round(factor, f"after three refused combines (factor {factor})")


@STEPS
@pytest.mark.parametrize("pending", ["dispatch", "combine"])
def test_destroy_with_a_pending_send_only_call(steps, pending):
    """Sequence 3: one rank destroys its handle while a send-only call of it is
    pending (no complete); the others complete theirs: their results are right,
    nobody waits for that rank, and every rank's next steps are right."""
    st = steps
    h = st.handle()
    try:
        st.dispatch(h, send_only=pending == "dispatch")
        if pending == "dispatch":
            if st.me != st.bad:
                h.complete()
                assert list(st.counts) == (
                    [len(r) for r in ref.received_ll(st.s, st.me)] if st.ll else
                    [sum(int((ids == l).sum()) for _, _, ids, _ in ref.received_ht(st.s, st.me))
                     for l in range(st.s.local_experts)])
        else:
            st.combine(h, 1, send_only=True)
            if st.me != st.bad:
                h.complete()
                st.check(1, "the send-only combine the others completed")
    finally:
        h.destroy()  # the bad rank's completes its pending call; the others' releases the LL buffers
    for factor in (2, 4, 8):
        st.round(factor, f"after a destroy with a pending send-only {pending} (factor {factor})")
