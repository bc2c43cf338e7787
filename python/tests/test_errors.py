"""Bad input through goep.ep gets a clear error (NcclInvalid, naming the bad
value) and nothing is written; the group stays usable. Every rank passes the
same bad input, so no collective call is left half made."""

import ctypes
import time

import numpy as np
import pytest

import ep_reference as ref
import goep.ep as nccl_ep
from goep.ep import _lib

LL, HT = nccl_ep.Algorithm.LOW_LATENCY, nccl_ep.Algorithm.HIGH_THROUGHPUT
SENTINEL = 0x7FC1  # a bfloat16 NaN no dispatch writes


@pytest.fixture
def setup(comm):
    """An LL group, a handle of this rank's routing, and its inputs and outputs."""
    R, me = comm.Get_size(), comm.Get_rank()
    s = ref.Shape(nranks=R, num_experts=4 * R, topk=2, hidden=16, max_tokens=6)
    cfg = nccl_ep.GroupConfig(algorithm=LL, num_experts=s.num_experts, max_dispatch_tokens_per_rank=s.max_tokens,
                              max_token_bytes=s.hidden * 2, num_topk=s.topk, timeout_ns=20 * 10**9)
    group = nccl_ep.Group.create(comm, cfg)
    T = s.tokens_of(me)
    handle = group.create_handle(nccl_ep.Layout.EXPERT_MAJOR, ref.experts(s, me))
    env = dict(
        s=s, group=group, handle=handle, T=T,
        x=ref.to_bf16(ref.values(me, T, s.hidden)), w=ref.weights(T, s.topk),
        recv=np.full((s.local_experts, R * s.max_tokens, s.hidden), SENTINEL, dtype=np.uint16),
        counts=np.full(s.local_experts, -7, dtype=np.int32),
    )
    yield env
    if group._ptr:
        group.destroy()


def dispatch(env, **changes):
    inputs = nccl_ep.DispatchInputs(tokens=changes.get("tokens", env["x"]), topk_weights=changes.get("w", env["w"]))
    outputs = nccl_ep.DispatchOutputs(tokens=changes.get("recv", env["recv"]))
    info = nccl_ep.LayoutInfo(expert_counters=changes.get("counts", env["counts"]))
    env["handle"].dispatch(inputs, outputs, layout_info=info)


def untouched(env):
    return bool((env["recv"] == SENTINEL).all() and (env["counts"] == -7).all())


@pytest.mark.parametrize("bad, message", [
    ("wrong shape", "inputs->tokens has shape [{T}, 17], want [num_tokens of the handle's topk_idx, hidden]"),
    ("wrong dtype", "inputs->tokens has datatype float32, want bfloat16"),
    ("float64 weights", "inputs->topk_weights has datatype float64, want float32"),
    ("short outputs", "outputs->tokens has shape"),
    ("int16 counters", "numpy dtype int16 has no goep element type"),
    ("non-contiguous", "inputs.tokens is not C-contiguous"),
    ("read-only output", "outputs.tokens is read-only"),
])
def test_bad_dispatch_input_is_refused_and_writes_nothing(setup, bad, message):
    env, T, H = setup, setup["T"], setup["s"].hidden
    change = {
        "wrong shape": dict(tokens=np.zeros((T, H + 1), dtype=np.uint16)),
        "wrong dtype": dict(tokens=np.zeros((T, H), dtype=np.float32)),
        "float64 weights": dict(w=env["w"].astype(np.float64)),
        "short outputs": dict(recv=env["recv"][:, :-1].copy()),
        "int16 counters": dict(counts=np.zeros(env["s"].local_experts, dtype=np.int16)),
        "non-contiguous": dict(tokens=np.zeros((T, 2 * H), dtype=np.uint16)[:, ::2]),
        "read-only output": dict(recv=np.frombuffer(bytes(env["recv"].nbytes), dtype=np.uint16).reshape(env["recv"].shape)),
    }[bad]
    with pytest.raises(nccl_ep.NcclInvalid, match=None) as e:
        dispatch(env, **change)
    assert message.format(T=T) in str(e.value)
    assert untouched(env), "a refused dispatch wrote its outputs"
    # ... and the group goes on: a good round.
    dispatch(env)
    assert not untouched(env)
    out = np.zeros((T, H), dtype=np.uint16)
    env["handle"].combine(nccl_ep.CombineInputs(tokens=env["recv"]), nccl_ep.CombineOutputs(tokens=out))
    np.testing.assert_array_equal(ref.from_bf16(out), ref.combined(env["s"], env["group"].rank))


def test_bad_combine_input_is_refused_and_writes_nothing(setup):
    env, T, H = setup, setup["T"], setup["s"].hidden
    out = np.full((T, H), SENTINEL, dtype=np.uint16)
    with pytest.raises(nccl_ep.NcclInvalid, match="has not been dispatched"):
        env["handle"].combine(nccl_ep.CombineInputs(tokens=env["recv"]), nccl_ep.CombineOutputs(tokens=out))
    dispatch(env)
    with pytest.raises(nccl_ep.NcclInvalid, match=r"outputs->tokens has shape \[%d, 8\]" % T):
        env["handle"].combine(nccl_ep.CombineInputs(tokens=env["recv"]),
                              nccl_ep.CombineOutputs(tokens=np.zeros((T, 8), dtype=np.uint16)))
    with pytest.raises(nccl_ep.NcclInvalid, match="inputs->tokens has datatype float32"):
        env["handle"].combine(nccl_ep.CombineInputs(tokens=env["recv"].astype(np.float32)),
                              nccl_ep.CombineOutputs(tokens=out))
    assert (out == SENTINEL).all()
    env["handle"].combine(nccl_ep.CombineInputs(tokens=env["recv"]), nccl_ep.CombineOutputs(tokens=out))
    np.testing.assert_array_equal(ref.from_bf16(out), ref.combined(env["s"], env["group"].rank))


def test_bad_routing_is_refused_at_create_handle(setup):
    group, s = setup["group"], setup["s"]
    with pytest.raises(nccl_ep.NcclInvalid, match=r"topk_idx\[0\]\[1\] = %d is not an expert id" % s.num_experts):
        group.create_handle(nccl_ep.Layout.EXPERT_MAJOR, np.array([[0, s.num_experts]], dtype=np.int64))
    with pytest.raises(nccl_ep.NcclInvalid, match="topk_idx has datatype float32"):
        group.create_handle(nccl_ep.Layout.EXPERT_MAJOR, np.zeros((1, s.topk), dtype=np.float32))
    with pytest.raises(nccl_ep.NcclInvalid, match="num_topk = %d, more than the group's config.num_topk = %d" % (s.topk + 1, s.topk)):
        group.create_handle(nccl_ep.Layout.EXPERT_MAJOR, np.zeros((1, s.topk + 1), dtype=np.int32))
    with pytest.raises(nccl_ep.NcclInvalid, match="more than config.max_dispatch_tokens_per_rank"):
        group.create_handle(nccl_ep.Layout.EXPERT_MAJOR, np.zeros((s.max_tokens + 1, s.topk), dtype=np.int32))
    with pytest.raises(nccl_ep.NcclInvalid, match="GOEP_EP_LAYOUT_FLAT is for HT groups") as e:
        group.create_handle(nccl_ep.Layout.FLAT, ref.experts(s, 0))
    assert e.value.status == nccl_ep.Result.InvalidUsage


def test_destroyed_group_and_handle(setup):
    group, handle = setup["group"], setup["handle"]
    other = group.create_handle(nccl_ep.Layout.EXPERT_MAJOR, ref.experts(setup["s"], group.rank))
    handle.destroy()
    with pytest.raises(nccl_ep.NcclInvalid, match="the handle is destroyed"):
        dispatch(setup)
    ptr = group.ptr
    group.destroy()
    with pytest.raises(nccl_ep.NcclInvalid, match="the group is destroyed"):
        group.create_handle(nccl_ep.Layout.EXPERT_MAJOR, ref.experts(setup["s"], 0))
    # The library itself refuses the stale numbers, whatever the wrapper does.
    with pytest.raises(nccl_ep.NcclInvalid, match="is not a live group"):
        _lib.call("goepEpGroupDestroy", ptr)
    with pytest.raises(nccl_ep.NcclInvalid, match="is not a live handle"):
        other.destroy()


def test_structs_of_the_wrong_size_or_magic(setup):
    """What a hand-made or mismatched struct gets from the library."""
    env = setup
    tok = nccl_ep.Tensor(env["x"])
    cin = _lib.new(_lib.DispatchInputs_c, tokens=tok.address)
    recv, counts = nccl_ep.Tensor(env["recv"]), nccl_ep.Tensor(env["counts"])
    cout = _lib.new(_lib.DispatchOutputs_c, tokens=recv.address)
    info = _lib.new(_lib.LayoutInfo_c, expert_counters=counts.address)
    h = env["handle"].ptr
    cin.size = 16
    with pytest.raises(nccl_ep.NcclInvalid, match=r"inputs \(goepEpDispatchInputs_t\) has size 16, want at least 32"):
        _lib.call("goepEpDispatch", h, ctypes.byref(cin), ctypes.byref(cout), ctypes.byref(info), None)
    cin.size, cout.magic = ctypes.sizeof(cin), 0x1234
    with pytest.raises(nccl_ep.NcclInvalid, match="has magic 0x00001234, want 0x60e9e9a1: initialise it with GOEP_EP_DISPATCH_OUTPUTS_INIT"):
        _lib.call("goepEpDispatch", h, ctypes.byref(cin), ctypes.byref(cout), ctypes.byref(info), None)
    cout.magic = _lib.MAGIC
    tok._c.magic = 0
    with pytest.raises(nccl_ep.NcclInvalid, match="inputs->tokens .* initialise it with GOEP_EP_TENSOR_INIT"):
        _lib.call("goepEpDispatch", h, ctypes.byref(cin), ctypes.byref(cout), ctypes.byref(info), None)
    cfg = nccl_ep.GroupConfig(num_experts=4, max_dispatch_tokens_per_rank=1, max_token_bytes=2, num_topk=1)._c()
    cfg.size = 8
    with pytest.raises(nccl_ep.NcclInvalid, match="config .* has size 8"):
        _lib.call("goepEpBufferPlan", ctypes.byref(cfg), 1, 1, ctypes.byref(_lib.new(_lib.MemInfo_c)))
    assert untouched(env)


def test_bad_group_config(comm):
    with pytest.raises(nccl_ep.NcclInvalid, match="config.num_topk = 65: want 0"):
        nccl_ep.Group.create(comm, nccl_ep.GroupConfig(num_experts=comm.Get_size(), max_dispatch_tokens_per_rank=1,
                                                       max_token_bytes=2, num_topk=65))
    with pytest.raises(nccl_ep.NcclInvalid, match="config.datatype = int32"):
        nccl_ep.Group.create(comm, nccl_ep.GroupConfig(num_experts=comm.Get_size(), max_dispatch_tokens_per_rank=1,
                                                       max_token_bytes=4, num_topk=1, datatype=nccl_ep.INT32))
    with pytest.raises(nccl_ep.NcclInvalid, match="want a goep.core.Communicator or an mpi4py communicator"):
        nccl_ep.Group.create("world", nccl_ep.GroupConfig())


def test_one_rank_bad_input_fails_every_rank_at_once(setup, comm):
    """One rank's bad tokens fail its dispatch (NcclInvalid) and every other
    rank's same dispatch at once (NcclRemoteError naming that rank), long
    before the group's timeout; then a good round runs."""
    env, T, H = setup, setup["T"], setup["s"].hidden
    me, bad = comm.Get_rank(), comm.Get_size() - 1
    start = time.monotonic()
    with pytest.raises(nccl_ep.NCCLError) as e:
        if me == bad:
            dispatch(env, tokens=np.zeros((T, H + 1), dtype=np.uint16))
        else:
            dispatch(env)
    assert time.monotonic() - start < 10, "refused at once, not at the 20 s timeout"
    assert "inputs->tokens has shape" in str(e.value)
    if me == bad:
        assert isinstance(e.value, nccl_ep.NcclInvalid)
    else:
        assert isinstance(e.value, nccl_ep.NcclRemoteError)
        assert f"rank {bad} refused the call" in str(e.value)
    dispatch(env)
    out = np.zeros((T, H), dtype=np.uint16)
    env["handle"].combine(nccl_ep.CombineInputs(tokens=env["recv"]), nccl_ep.CombineOutputs(tokens=out))
    np.testing.assert_array_equal(ref.from_bf16(out), ref.combined(env["s"], env["group"].rank))
