"""What a program written for nccl.ep takes from nccl.ep and nccl.core, in
goep.ep and goep.core: the element types and their numbers, unique ids and a
Communicator over MPI that Group.create takes, NCCLEpError, get_lib_version,
OverflowPolicy and ZeroCopyMode, every GroupConfig field in nccl.ep's order,
and the allocator hooks.

NCCL's numbers and nccl.ep's field order are written out here from NCCL's
headers and nccl.ep's GroupConfig, as the reference the package must match.
"""

import ctypes
import dataclasses
import pickle
import re
from pathlib import Path

import numpy as np
import pytest

import ep_reference as ref
import goep.core as nccl_core
import goep.core.typing
import goep.ep as nccl_ep

LL, HT = nccl_ep.Algorithm.LOW_LATENCY, nccl_ep.Algorithm.HIGH_THROUGHPUT

# ncclDataType_t (nccl.h), with its aliases, and the number NCCL reserves for packed FP4 (nccl_ep.h's
# ncclFloat4x2).
NCCL_TYPES = {"INT8": 0, "CHAR": 0, "UINT8": 1, "INT32": 2, "INT": 2, "UINT32": 3, "INT64": 4, "UINT64": 5,
              "FLOAT16": 6, "HALF": 6, "FLOAT32": 7, "FLOAT": 7, "FLOAT64": 8, "DOUBLE": 8, "BFLOAT16": 9,
              "FLOAT8E4M3": 10, "FLOAT8E5M2": 11, "FLOAT4X2": 12}
# nccl.ep's GroupConfig, in its order.
NCCL_GROUP_FIELDS = ["algorithm", "num_experts", "max_dispatch_tokens_per_rank", "max_recv_tokens_per_rank",
                     "max_token_bytes", "rdma_buffer_size", "num_qp_per_rank", "num_channels", "max_num_sms", "alloc",
                     "enable_mask", "timeout_ns", "zero_copy", "overflow_policy", "num_topk"]


def test_data_types_are_nccls():
    for name, number in NCCL_TYPES.items():
        member = getattr(nccl_core, name)
        assert member is nccl_core.NcclDataType[name] and int(member) == number, name
        assert getattr(goep.core.typing, name) is member
    assert nccl_core.CHAR is nccl_core.INT8 and nccl_core.DOUBLE is nccl_core.FLOAT64
    # The same numbers as goep.ep's own types: either passes for the other.
    for d in nccl_ep.DataType:
        assert nccl_core.NcclDataType[d.name] == d and hash(nccl_core.NcclDataType[d.name]) == hash(d)
    assert nccl_core.NcclInvalid is goep.core.typing.NcclInvalid is nccl_ep.NcclInvalid


def test_nccl_core_types_describe_tensors():
    a = np.zeros((2, 3), np.uint16)
    t = nccl_ep.Tensor(a.ctypes.data, dtype=nccl_core.BFLOAT16, shape=(2, 3))
    assert t.datatype == nccl_core.BFLOAT16 and t.data == a.ctypes.data
    assert {nccl_core.INT64: 8}[nccl_ep.Tensor(np.zeros(4, np.int64)).datatype] == 8
    # e4m3 codes (an FP8 dispatch's) are bytes described as FLOAT8E4M3; other element sizes are refused.
    assert nccl_ep.Tensor(np.zeros(4, np.uint8), dtype=nccl_core.FLOAT8E4M3).datatype == nccl_core.FLOAT8E4M3
    with pytest.raises(nccl_ep.NcclInvalid, match="dtype=FLOAT8E4M3 has 1-byte elements but the memory's are 2 bytes"):
        nccl_ep.Tensor(np.zeros(4, np.uint16), dtype=nccl_core.FLOAT8E4M3)


def test_unique_id():
    a, b = nccl_core.get_unique_id(), nccl_core.get_unique_id()
    assert len(a.as_bytes) == len(bytes(a)) == 128 and a != b
    assert pickle.loads(pickle.dumps(a)) == a
    assert nccl_core.UniqueId.from_bytes(a.as_bytes) == a and hash(nccl_core.UniqueId.from_bytes(a.as_bytes)) == hash(a)
    assert nccl_core.get_unique_id(empty=True).as_bytes == bytes(128)
    with pytest.raises(nccl_ep.NcclInvalid, match="a unique id is 128 bytes, got 5"):
        nccl_core.UniqueId.from_bytes(b"short")


def counting_hooks():
    """Allocator hooks that record their calls (and allocate nothing)."""
    calls = []

    @nccl_ep.AllocFn
    def alloc(ptr, size, context):
        calls.append(("alloc", size))
        return 2

    @nccl_ep.FreeFn
    def free(ptr, context):
        calls.append(("free", ptr))
        return 0

    cfg = nccl_ep.AllocConfig(alloc_fn=ctypes.cast(alloc, ctypes.c_void_p).value,
                              free_fn=ctypes.cast(free, ctypes.c_void_p).value, context=1234)
    return cfg, calls, (alloc, free)


def ll_round(group, s, me):
    """An LL round with identity experts; returns the combined values."""
    T, H, L = s.tokens_of(me), s.hidden, s.local_experts
    handle = group.create_handle(nccl_ep.Layout.EXPERT_MAJOR, ref.experts(s, me))
    recv = np.zeros((L, s.nranks * s.max_tokens, H), np.uint16)
    handle.dispatch(nccl_ep.DispatchInputs(tokens=ref.to_bf16(ref.values(me, T, H)),
                                           topk_weights=ref.weights(T, s.topk)),
                    nccl_ep.DispatchOutputs(tokens=recv),
                    layout_info=nccl_ep.LayoutInfo(expert_counters=np.zeros(L, np.int32)))
    out = np.zeros((T, H), np.uint16)
    handle.combine(nccl_ep.CombineInputs(tokens=recv), nccl_ep.CombineOutputs(tokens=out))
    handle.destroy()
    return ref.from_bf16(out)


def test_communicator_init_and_a_round_over_it(comm):
    """ep_test.py's communicator lines: rank 0 makes the unique id, MPI
    broadcasts it, every rank inits. The Communicator connects the ranks, a
    group over it with every GPU-only field and allocator hooks set combines
    the reference's values, and the hooks are never called."""
    me, R = comm.Get_rank(), comm.Get_size()
    uid = nccl_core.get_unique_id() if me == 0 else None
    uid = comm.bcast(uid, root=0)
    c = nccl_core.Communicator.init(nranks=R, rank=me, unique_id=uid)
    assert c.nranks == R and c.rank == me and c.ptr
    assert c.mpi.allreduce(me + 1) == R * (R + 1) // 2
    s = ref.Shape(nranks=R, num_experts=4 * R, topk=2, hidden=16, max_tokens=6)
    alloc, calls, _keep = counting_hooks()
    cfg = nccl_ep.GroupConfig(algorithm=LL, num_experts=s.num_experts, max_dispatch_tokens_per_rank=s.max_tokens,
                              max_recv_tokens_per_rank=R * s.max_tokens, max_token_bytes=s.hidden * 2,
                              rdma_buffer_size=1 << 30, num_qp_per_rank=4, num_channels=8, max_num_sms=20, alloc=alloc,
                              timeout_ns=30 * 10**9, zero_copy=nccl_ep.ZeroCopyMode.OFF,
                              overflow_policy=nccl_ep.OverflowPolicy.TRAP, num_topk=s.topk)
    group = nccl_ep.Group.create(c, cfg)
    assert group.nranks == R and group.rank == me
    np.testing.assert_array_equal(ll_round(group, s, me), ref.combined(s, me))
    group.destroy()
    assert calls == [], "goep called the allocator hooks"
    c.destroy()
    c.destroy()  # a second destroy does nothing
    with pytest.raises(nccl_ep.NcclInvalid, match="the communicator is destroyed"):
        c.nranks
    with pytest.raises(nccl_ep.NcclInvalid, match="the communicator is destroyed"):
        nccl_ep.Group.create(c, cfg)
    # An mpi4py communicator wrapped, not owned: destroy leaves it usable.
    w = nccl_core.Communicator.from_mpi(comm)
    assert w.nranks == R
    w.destroy()
    assert comm.allreduce(1) == R


@pytest.mark.multirank
def test_communicator_init_groups_processes_by_unique_id(comm):
    """Two unique ids: the processes that pass each form a communicator,
    ordered by the ranks they pass (here the reverse of the world's)."""
    me, R = comm.Get_rank(), comm.Get_size()
    first = me < R // 2
    lead = 0 if first else R // 2
    ids = comm.allgather(nccl_core.get_unique_id() if me == lead else None)
    members = list(range(0, R // 2)) if first else list(range(R // 2, R))
    n = len(members)
    rank = n - 1 - members.index(me)
    c = nccl_core.Communicator.init(nranks=n, rank=rank, unique_id=ids[lead])
    assert c.nranks == n and c.rank == rank
    assert c.mpi.allgather(me) == members[::-1]
    c.destroy()


def test_communicator_init_refused_on_every_rank(comm):
    """Arguments that do not fit together raise NcclInvalid on every process,
    naming them (no process waits for the others); then a good init works."""
    me, R = comm.Get_rank(), comm.Get_size()
    uid = comm.bcast(nccl_core.get_unique_id() if me == 0 else None, root=0)
    cases = [
        (dict(nranks=R + 1, rank=me, unique_id=uid), f"nranks={R + 1}, but {R} processes"),
        (dict(nranks=R, rank=me, unique_id=None if me == R - 1 else uid),
         f"process {R - 1} of MPI.COMM_WORLD: unique_id is a NoneType"),
        (dict(nranks=R, rank=me, unique_id=nccl_core.get_unique_id(empty=True)), "unique_id is empty"),
        (dict(nranks=R, rank=0, unique_id=uid) if R > 1 else dict(nranks=1, rank=1, unique_id=uid),
         r"pass ranks \[0, 0" if R > 1 else r"nranks=1, rank=1: want nranks >= 1 and 0 <= rank < nranks"),
    ]
    for kwargs, message in cases:
        with pytest.raises(nccl_ep.NcclInvalid, match=message):
            nccl_core.Communicator.init(**kwargs)
    c = nccl_core.Communicator.init(nranks=R, rank=me, unique_id=uid)
    assert c.mpi.allreduce(1) == R
    c.destroy()


def test_ncclep_error_and_version():
    assert nccl_ep.NCCLEpError is nccl_ep.NCCLError
    e = nccl_ep.NCCLEpError(5)
    assert e.status == nccl_ep.Result.InvalidUsage and str(e) == "InvalidUsage"
    with pytest.raises(nccl_ep.NCCLEpError, match="goep has no registered windows") as raised:
        nccl_ep.Tensor(np.zeros(3, np.float32), window=object(), window_offset=0)
    assert raised.value.status == nccl_ep.Result.InvalidArgument
    v = nccl_ep.get_lib_version()
    header = (Path(__file__).resolve().parents[2] / "capi" / "goep_ep.h").read_text()
    want = tuple(int(re.search(rf"#define GOEP_EP_{f} (\d+)", header).group(1)) for f in ("MAJOR", "MINOR", "PATCH"))
    assert (v.major, v.minor, v.micro) == v.release == v == want
    assert str(v) == "%d.%d.%d" % want == "0.1.0"


def test_enums_have_nccls_numbers():
    # ncclEpOverflowPolicy_t, ncclEpZeroCopyMode_t (ep_enums.h): AUTO is NCCL_EP_AUTO, 0.
    assert [(m.name, int(m)) for m in nccl_ep.OverflowPolicy] == [("AUTO", 0), ("TRAP", 1), ("DROP", 2)]
    assert [(m.name, int(m)) for m in nccl_ep.ZeroCopyMode] == [("AUTO", 0), ("OFF", 1), ("ON", 2)]
    assert nccl_ep.OverflowPolicy.OVERFLOW_DROP is nccl_ep.OverflowPolicy.DROP
    assert nccl_ep.ZeroCopyMode.ZERO_COPY_ON is nccl_ep.ZeroCopyMode.ON
    # ncclEpDispQuant_t, ncclEpCombQuant_t; goep's FP8 combine and its group recipe of NVFP4 forwarding numbered
    # apart from NCCL's recipes.
    assert [(m.name, int(m)) for m in nccl_ep.DispatchQuantizationRecipe] == [("NONE", 0), ("FWD", 1), ("DS_FP8E3M4", 2),
                                                                            ("FWD_NVFP4", 0x100)]
    assert [(m.name, int(m)) for m in nccl_ep.CombineQuantizationRecipe] == [("NONE", 0), ("NVFP4", 1), ("FP8", 0x100),
                                                                           ("FP8_UE8M0", 0x101)]


def test_group_config_fields_in_nccls_order():
    names = [f.name for f in dataclasses.fields(nccl_ep.GroupConfig)]
    assert names == NCCL_GROUP_FIELDS + ["datatype", "backend", "combine_quant", "dispatch_quant", "dispatch_round_scales"]
    d = nccl_ep.GroupConfig()
    assert (d.num_topk, d.zero_copy, d.overflow_policy, d.alloc) == (0, 0, 0, nccl_ep.AllocConfig(0, 0, 0))
    p = nccl_ep.GroupConfig(HT, 8, 16, 64, 256, 1 << 20)
    assert (p.algorithm, p.num_experts, p.max_dispatch_tokens_per_rank, p.max_recv_tokens_per_rank,
            p.max_token_bytes, p.rdma_buffer_size) == (HT, 8, 16, 64, 256, 1 << 20)
    assert nccl_ep.AllocFn._restype_ is ctypes.c_int
    assert nccl_ep.AllocFn._argtypes_ == (ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_void_p)
    assert nccl_ep.FreeFn._argtypes_ == (ctypes.c_void_p, ctypes.c_void_p)


def test_gpu_only_fields_leave_the_plan_as_it_is():
    """The GPU-only fields are kept, and the resource sizes among them change
    nothing the library sizes."""
    base = dict(algorithm=HT, num_experts=8, max_dispatch_tokens_per_rank=16, max_token_bytes=256, num_topk=2)
    alloc, calls, _keep = counting_hooks()
    gpu = nccl_ep.GroupConfig(**base, rdma_buffer_size=1 << 33, num_qp_per_rank=16, num_channels=24, max_num_sms=132,
                              alloc=alloc, zero_copy=nccl_ep.ZeroCopyMode.OFF, overflow_policy=nccl_ep.OverflowPolicy.DROP)
    assert nccl_ep.buffer_plan(gpu, 4, 2) == nccl_ep.buffer_plan(nccl_ep.GroupConfig(**base), 4, 2)
    assert gpu.rdma_buffer_size == 1 << 33 and gpu.alloc is alloc and calls == []


@pytest.mark.parametrize("change, message", [
    (dict(rdma_buffer_size=-1), r"GroupConfig.rdma_buffer_size = -1: want an integer from 0 to 2\*\*64-1"),
    (dict(num_qp_per_rank=1 << 32), r"GroupConfig.num_qp_per_rank = 4294967296: want an integer from 0 to 2\*\*32-1"),
    (dict(num_channels=2.0), "GroupConfig.num_channels = 2.0"),
    (dict(max_num_sms="8"), "GroupConfig.max_num_sms = '8'"),
    (dict(num_topk=-1), "GroupConfig.num_topk = -1"),
    (dict(zero_copy=3), "GroupConfig.zero_copy = 3: want one of AUTO, OFF, ON"),
    (dict(overflow_policy=7), "GroupConfig.overflow_policy = 7: want one of AUTO, TRAP, DROP"),
    (dict(datatype=nccl_core.FLOAT8E4M3), r"config.datatype = float8e4m3 \(10\): want BFLOAT16 or FLOAT32"),
    (dict(datatype=nccl_core.UINT64), r"config.datatype = uint64 \(5\): want BFLOAT16 or FLOAT32"),
    (dict(combine_quant=2), "GroupConfig.combine_quant = 2: want one of NONE, NVFP4, FP8, FP8_UE8M0"),
    (dict(dispatch_quant=3), "GroupConfig.dispatch_quant = 3: want one of NONE, FWD, DS_FP8E3M4, FWD_NVFP4"),
    (dict(dispatch_round_scales=2), "GroupConfig.dispatch_round_scales = 2: want 0 or 1"),
    (dict(alloc="cudaMalloc"), "GroupConfig.alloc is a str; want an AllocConfig"),
    (dict(alloc=nccl_ep.AllocConfig(alloc_fn=nccl_ep.AllocFn(lambda p, n, c: 0))),
     r"GroupConfig.alloc.alloc_fn is a ctypes function; want its address: ctypes.cast\(fn, ctypes.c_void_p\).value"),
    (dict(alloc=nccl_ep.AllocConfig(free_fn=-1)), "GroupConfig.alloc.free_fn = -1: want an address"),
])
def test_bad_group_config_fields(change, message):
    cfg = nccl_ep.GroupConfig(**{**dict(num_experts=8, max_dispatch_tokens_per_rank=16, max_token_bytes=256, num_topk=2),
                                 **change})
    with pytest.raises(nccl_ep.NcclInvalid, match=message):
        nccl_ep.buffer_plan(cfg, 4, 1)


@pytest.mark.parametrize("backend", ["cpu", "cpu-onesided"])
def test_backend_by_name(comm, backend):
    """A group on a backend named in GroupConfig.backend combines the
    reference's values and says which backend it runs on."""
    me, R = comm.Get_rank(), comm.Get_size()
    s = ref.Shape(nranks=R, num_experts=4 * R, topk=2, hidden=16, max_tokens=6)
    cfg = nccl_ep.GroupConfig(algorithm=LL, num_experts=s.num_experts, max_dispatch_tokens_per_rank=s.max_tokens,
                              max_token_bytes=s.hidden * 2, num_topk=s.topk, backend=backend)
    group = nccl_ep.Group.create(comm, cfg)
    np.testing.assert_array_equal(ll_round(group, s, me), ref.combined(s, me))
    group.destroy()


@pytest.mark.parametrize("backend, message", [
    ("no-such-backend", 'options.backend = "no-such-backend": .*not registered'),
    ("alltoallv", 'options.backend = "alltoallv": .*does not declare'),
])
def test_backend_refused_by_name(comm, backend, message):
    cfg = nccl_ep.GroupConfig(algorithm=LL, num_experts=4 * comm.Get_size(), max_dispatch_tokens_per_rank=4,
                              max_token_bytes=32, num_topk=2, backend=backend)
    with pytest.raises(nccl_ep.NCCLEpError, match=message):
        nccl_ep.Group.create(comm, cfg)
