"""Tensors described in place from PyTorch, DLPack and the array interface.

Full LL and HT rounds whose every array is a torch tensor, a DLPack object or
an ``__array_interface__`` object give, bit for bit, what the same round with
numpy arrays gives (and the reference's values): each kind's outputs are read
back from the memory the caller owns, so a copy made on the way would show as
zeros. Device memory and non-contiguous tensors are refused on every rank.

torch is imported, never skipped: ``scripts/install-deps.sh --python-test``
installs Debian's python3-torch, and without it these tests fail.
"""

import ctypes
import gc
import os
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

import ep_reference as ref
import goep.ep as nccl_ep
from test_sequences import Steps

LL, HT = nccl_ep.Algorithm.LOW_LATENCY, nccl_ep.Algorithm.HIGH_THROUGHPUT
BF16, F32 = nccl_ep.BFLOAT16, nccl_ep.FLOAT32


class DLPackOnly:
    """Offers an array through DLPack alone."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


class ArrayInterfaceOnly:
    """Offers a numpy array's memory through ``__array_interface__`` (v3) alone."""

    def __init__(self, a, typestr=None, strides=None, readonly=False, version=3):
        self.a = a
        self.__array_interface__ = dict(version=version, shape=a.shape, typestr=typestr or a.dtype.str,
                                        data=(a.ctypes.data, readonly), strides=strides)


class CUDAInterface:
    """Device memory as CuPy or Numba offers it (never dereferenced here)."""

    def __init__(self, shape, typestr="<u2"):
        self.__cuda_array_interface__ = dict(version=3, shape=shape, typestr=typestr, data=(0x7F0000000000, False),
                                             strides=None)


class DLPackOnDevice:
    """A DLPack object whose memory is on a GPU: it must be refused before its
    capsule is asked for."""

    def __init__(self, kind=2):
        self.kind = kind

    def __dlpack_device__(self):
        return (self.kind, 0)

    def __dlpack__(self, stream=None):
        raise AssertionError("__dlpack__ called for device memory")


def bits(x) -> np.ndarray:
    """The bytes of an array of any kind, as unsigned integers of its element
    size, read from the memory the caller owns."""
    if isinstance(x, (DLPackOnly, ArrayInterfaceOnly)):
        x = x.a
    if isinstance(x, torch.Tensor):
        x = x.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]).numpy()
    x = np.ascontiguousarray(x)
    return x.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[x.itemsize])


def maker(kind):
    """(tokens from float32 values, any other array from a numpy array, zeros of a numpy dtype) for a kind.
    bfloat16 tokens are made by each kind's own conversion: torch's .to(torch.bfloat16) for torch
    tensors, ep_reference's rounding for numpy arrays (the values are exact in bfloat16, so both agree)."""

    def np_tokens(f, dtype):
        return ref.to_bf16(f) if dtype == BF16 else np.ascontiguousarray(f, dtype=np.float32)

    def torch_tokens(f, dtype):
        return torch.from_numpy(np.ascontiguousarray(f, dtype=np.float32)).to(
            torch.bfloat16 if dtype == BF16 else torch.float32)

    def torch_zeros(shape, dtype):
        return torch.zeros(shape, dtype={np.uint16: torch.bfloat16, np.float32: torch.float32,
                                         np.int32: torch.int32, np.int64: torch.int64}[dtype])

    same = lambda a: a  # noqa: E731
    return {
        "numpy": (np_tokens, same, np.zeros),
        "torch": (torch_tokens, torch.from_numpy, torch_zeros),
        "dlpack-torch": (lambda f, d: DLPackOnly(torch_tokens(f, d)), lambda a: DLPackOnly(torch.from_numpy(a)),
                         lambda s, d: DLPackOnly(torch_zeros(s, d))),
        "dlpack-numpy": (lambda f, d: DLPackOnly(np_tokens(f, d)), DLPackOnly, lambda s, d: DLPackOnly(np.zeros(s, d))),
        "array-interface": (lambda f, d: ArrayInterfaceOnly(np_tokens(f, d)), ArrayInterfaceOnly,
                            lambda s, d: ArrayInterfaceOnly(np.zeros(s, d))),
    }[kind]


def run_round(comm, algorithm, dtype, kind, send_only=False):
    """A whole round with every array of the kind; returns what it wrote, as bits."""
    tokens, other, zeros = maker(kind)
    s = ref.Shape(nranks=comm.Get_size(), num_experts=4 * comm.Get_size(), topk=3, hidden=40, max_tokens=12)
    me, R = comm.Get_rank(), comm.Get_size()
    T, H, K, L = s.tokens_of(me), s.hidden, s.topk, s.local_experts
    ll = algorithm == LL
    np_dtype = np.uint16 if dtype == BF16 else np.float32
    cfg = nccl_ep.GroupConfig(algorithm=algorithm, num_experts=s.num_experts, max_dispatch_tokens_per_rank=s.max_tokens,
                              max_token_bytes=H * (2 if dtype == BF16 else 4), num_topk=K, datatype=dtype,
                              timeout_ns=30 * 10**9)
    got = {}
    with nccl_ep.Group.create(comm, cfg) as group:
        handle = group.create_handle(nccl_ep.Layout.EXPERT_MAJOR if ll else nccl_ep.Layout.FLAT,
                                     other(ref.experts(s, me)))
        w = other(ref.weights(T, K))
        counts, total = zeros(L, np.int64), zeros(1, np.int32)
        if ll:
            recv = zeros((L, R * s.max_tokens, H), np_dtype)
            outputs = nccl_ep.DispatchOutputs(tokens=recv)
        else:
            recv = zeros((R * s.max_tokens, H), np_dtype)
            recv_w, recv_idx = zeros((R * s.max_tokens, K), np.float32), zeros((R * s.max_tokens, K), np.int32)
            outputs = nccl_ep.DispatchOutputs(tokens=recv, topk_weights=recv_w, topk_idx=recv_idx)
            got.update(recv_w=recv_w, recv_idx=recv_idx)
        handle.dispatch(nccl_ep.DispatchInputs(tokens=tokens(ref.values(me, T, H), dtype), topk_weights=w), outputs,
                        layout_info=nccl_ep.LayoutInfo(expert_counters=counts, recv_total_counter=total),
                        config=nccl_ep.DispatchConfig(send_only=int(send_only)))
        handle.complete()
        got.update(recv=recv, counts=counts, total=total)
        if ll:
            y = recv  # identity experts
        else:
            # The experts apply the weights, computed here from the rows read back (numpy) and handed
            # over as the kind under test.
            n = int(bits(total)[0])
            f = ref.from_bf16(bits(recv)) if dtype == BF16 else bits(recv).view(np.float32)
            f = f * np.where(np.arange(len(f))[:, None] < n, bits(recv_w).view(np.float32).sum(axis=1, keepdims=True), 0)
            y = tokens(f, dtype)
        out = zeros((T, H), np_dtype)
        handle.combine(nccl_ep.CombineInputs(tokens=y),
                       nccl_ep.CombineOutputs(tokens=out, topk_weights=w if ll else None),
                       config=nccl_ep.CombineConfig(send_only=int(send_only)))
        handle.complete()
        got["out"] = out
        handle.destroy()
    return {k: bits(v).copy() for k, v in got.items()}, s


@pytest.mark.parametrize("kind", ["torch", "dlpack-torch", "dlpack-numpy", "array-interface"])
@pytest.mark.parametrize("dtype", [BF16, F32], ids=["bf16", "f32"])
@pytest.mark.parametrize("algorithm", [LL, HT], ids=["ll", "ht"])
def test_round_of_each_kind_equals_the_numpy_round(comm, algorithm, dtype, kind):
    want, s = run_round(comm, algorithm, dtype, "numpy")
    got, _ = run_round(comm, algorithm, dtype, kind, send_only=kind == "torch")
    me = comm.Get_rank()
    combined = want["out"].view(np.float32) if dtype == F32 else ref.from_bf16(want["out"])
    np.testing.assert_array_equal(combined, ref.combined(s, me), err_msg="the numpy round itself")
    assert want["counts"].sum() > 0 or s.tokens_of(me) == 0
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        np.testing.assert_array_equal(got[k], want[k], err_msg=f"{kind}: {k} differs from the numpy round's")


def test_torch_tensor_is_described_in_place():
    x = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    t = nccl_ep.Tensor(x[1:])  # contiguous, at an offset
    assert t.data == x[1:].data_ptr() == x.data_ptr() + 6 * 4
    assert t.sizes == t.shape == (3, 6) and t.ndim == 2 and t.datatype == nccl_ep.FLOAT32
    assert t.buffer is not None and not t.readonly
    b = nccl_ep.Tensor(torch.zeros(2, 3, 5, dtype=torch.bfloat16))
    assert b.datatype == nccl_ep.BFLOAT16 and b.ndim == 3 and b.sizes == (2, 3, 5)
    for td, want in [(torch.float16, nccl_ep.DataType.FLOAT16), (torch.float64, nccl_ep.DataType.FLOAT64),
                     (torch.int8, nccl_ep.DataType.INT8), (torch.uint8, nccl_ep.DataType.UINT8),
                     (torch.int32, nccl_ep.INT32), (torch.int64, nccl_ep.INT64)]:
        assert nccl_ep.Tensor(torch.zeros(3, dtype=td)).datatype == want, td


@pytest.mark.parametrize("make, message", [
    (lambda: torch.zeros(6, 4).t(), r"tensor is a torch tensor that is not contiguous \(shape \(4, 6\), strides \(1, 4\)\)"),
    (lambda: torch.zeros(4, 6, device="meta"), "tensor is a torch tensor on meta, not in host memory"),
    (lambda: torch.zeros(4, 6, dtype=torch.int16), "torch tensor of dtype torch.int16, which has no goep element type"),
    (lambda: torch.zeros(4, 6, dtype=torch.bool), "torch tensor of dtype torch.bool"),
    (lambda: torch.zeros(4, 6).to_sparse(), "torch tensor of layout torch.sparse_coo"),
    (lambda: torch.zeros(4, 6)._neg_view(), "negation or conjugation is not yet applied"),
    (lambda: torch.tensor(1.0), "tensor is a scalar"),
    (lambda: CUDAInterface((4, 6)), r"tensor is a CUDAInterface with __cuda_array_interface__ \(device memory\)"),
    (lambda: DLPackOnDevice(2), r"through DLPack\) is in kDLCUDA memory \(device 0\), not on the host"),
    (lambda: DLPackOnDevice(13), "is in kDLCUDAManaged memory"),
    (lambda: DLPackOnly(torch.zeros(6, 4).t()), r"through DLPack\) is not C-contiguous \(shape \(4, 6\), strides \(1, 4\)"),
    (lambda: DLPackOnly(np.zeros(4, np.complex64)), "kDLComplex of 64 bits x 1 lanes, which have no goep element type"),
    (lambda: DLPackOnly(np.zeros(4, np.int16)), "kDLInt of 16 bits x 1 lanes"),
    (lambda: ArrayInterfaceOnly(np.zeros((6, 4), np.float32), strides=(4, 24)), r"is not C-contiguous \(shape \(6, 4\), strides \(4, 24\) bytes\)"),
    (lambda: ArrayInterfaceOnly(np.zeros(4, np.float32), version=2), "of version 3, got version 2"),
    (lambda: ArrayInterfaceOnly(np.zeros(4, np.float32), typestr=">f4"), "not in this machine's byte order"),
    (lambda: ArrayInterfaceOnly(np.zeros(4, np.uint16), typestr="<V2"), r"numpy dtype \|V2 has no goep element type.*or pass dtype="),
])
def test_refused_with_what_was_passed(make, message):
    with pytest.raises(nccl_ep.NcclInvalid, match=message):
        nccl_ep.Tensor(make())


def test_outputs_must_be_writable_and_in_place():
    ro = np.zeros(4, np.float32)
    ro.setflags(write=False)
    with pytest.raises(nccl_ep.NcclInvalid, match="out is read-only"):
        nccl_ep.Tensor(ArrayInterfaceOnly(np.zeros(4, np.float32), readonly=True), writable=True, name="out")
    with pytest.raises(nccl_ep.NcclInvalid, match="out is read-only"):
        nccl_ep.Tensor(ro, writable=True, name="out")
    with pytest.raises(nccl_ep.NcclInvalid, match="out is a list, which goep cannot describe in place"):
        nccl_ep.Tensor([0.0, 0.0], writable=True, name="out")
    # A list is fine to read (numpy copies it).
    assert nccl_ep.Tensor([[1, 2]], dtype=nccl_ep.INT64).sizes == (1, 2)
    # A read-only Tensor made beforehand is refused where a call writes into it.
    with pytest.raises(nccl_ep.NcclInvalid, match="outputs.tokens is read-only"):
        from goep.ep.tensor import as_tensor
        as_tensor(nccl_ep.Tensor(ro), "outputs.tokens", writable=True)


def test_array_interface_is_described_in_place():
    a = np.arange(12, dtype=np.uint16).reshape(3, 4)
    t = nccl_ep.Tensor(ArrayInterfaceOnly(a))
    assert t.data == a.ctypes.data and t.sizes == (3, 4) and t.datatype == nccl_ep.BFLOAT16
    # '<V2' elements (ml_dtypes' bfloat16 reads so) need dtype=.
    v = nccl_ep.Tensor(ArrayInterfaceOnly(a, typestr="<V2"), dtype=nccl_ep.BFLOAT16)
    assert v.datatype == nccl_ep.BFLOAT16 and v.data == a.ctypes.data
    with pytest.raises(nccl_ep.NcclInvalid, match="dtype=FLOAT32 has 4-byte elements but the memory's are 2 bytes"):
        nccl_ep.Tensor(ArrayInterfaceOnly(a), dtype=nccl_ep.FLOAT32)
    # Strides that are row-major (a size-1 dimension's stride does not matter) are accepted.
    b = np.zeros((3, 1, 4), np.float32)
    assert nccl_ep.Tensor(ArrayInterfaceOnly(b, strides=(16, 999, 4))).data == b.ctypes.data


def test_dlpack_capsule_lives_with_the_tensor():
    """The capsule is kept with the Tensor (numpy's holds a reference to the
    array), and released with it (its deleter drops that reference)."""
    a = np.arange(10, dtype=np.float32)[2:]
    before = sys.getrefcount(a)
    t = nccl_ep.Tensor(DLPackOnly(a))
    assert t.data == a.ctypes.data and t.sizes == (8,) and t.datatype == nccl_ep.FLOAT32
    assert sys.getrefcount(a) > before, "the DLPack capsule (and the array it holds) is not kept"
    del t
    gc.collect()
    assert sys.getrefcount(a) == before, "the DLPack capsule's deleter did not run with the Tensor"
    # torch bfloat16 through DLPack: kDLBfloat.
    x = torch.zeros(3, 5, dtype=torch.bfloat16)
    u = nccl_ep.Tensor(DLPackOnly(x))
    assert u.datatype == nccl_ep.BFLOAT16 and u.data == x.data_ptr() and u.sizes == (3, 5)


def test_dlpack_versioned_capsule():
    """A DLPack 1.x capsule ('dltensor_versioned'), built here with ctypes as a
    producer would: its read-only flag is honoured."""
    from goep.ep.tensor import _DLManagedTensorVersioned

    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    shape = (ctypes.c_int64 * 2)(2, 3)
    new_capsule = ctypes.pythonapi.PyCapsule_New
    new_capsule.restype, new_capsule.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

    class Versioned:
        def __init__(self, flags):
            self.m = _DLManagedTensorVersioned(major=1, minor=0, flags=flags)
            self.m.dl_tensor.data, self.m.dl_tensor.ndim = a.ctypes.data, 2
            self.m.dl_tensor.device.device_type = 1
            self.m.dl_tensor.dtype.code, self.m.dl_tensor.dtype.bits, self.m.dl_tensor.dtype.lanes = 0, 32, 1
            self.m.dl_tensor.shape = shape

        def __dlpack_device__(self):
            return (1, 0)

        def __dlpack__(self, stream=None):
            return new_capsule(ctypes.addressof(self.m), b"dltensor_versioned", None)

    t = nccl_ep.Tensor(Versioned(0), writable=True)
    assert t.data == a.ctypes.data and t.sizes == (2, 3) and t.datatype == nccl_ep.INT32 and not t.readonly
    with pytest.raises(nccl_ep.NcclInvalid, match="out is read-only"):
        nccl_ep.Tensor(Versioned(1), writable=True, name="out")


def test_window_arguments():
    a = np.zeros(4, np.float32)
    with pytest.raises(nccl_ep.NcclInvalid, match="window= needs window_offset="):
        nccl_ep.Tensor(a, window=object())
    with pytest.raises(nccl_ep.NcclInvalid, match="window_offset= is only valid with window="):
        nccl_ep.Tensor(a, window_offset=0)
    with pytest.raises(nccl_ep.NcclInvalid, match="goep has no registered windows"):
        nccl_ep.Tensor(a, window=object(), window_offset=0)
    t = nccl_ep.Tensor(a, window=None, window_offset=None)
    assert t.sizes == (4,) and t.ndim == 1


def test_raw_address():
    a = np.zeros((2, 3), np.uint16)
    t = nccl_ep.Tensor(a.ctypes.data, dtype=nccl_ep.BFLOAT16, shape=(2, 3))
    assert t.data == a.ctypes.data and t.sizes == (2, 3) and t.ndim == 2 and t.buffer is None
    with pytest.raises(nccl_ep.NcclInvalid, match="dtype=13 .* has no goep element type"):
        nccl_ep.Tensor(a.ctypes.data, dtype=13, shape=(2, 3))
    # 12 is NCCL's packed FP4 (forwarded NVFP4 rows): bytes, two codes each.
    assert nccl_ep.Tensor(a.ctypes.data, dtype=12, shape=(2, 6)).datatype == nccl_ep.DataType.FLOAT4X2
    with pytest.raises(nccl_ep.NcclInvalid, match="a raw address needs dtype= and shape="):
        nccl_ep.Tensor(a.ctypes.data, dtype=nccl_ep.BFLOAT16)
    with pytest.raises(nccl_ep.NcclInvalid, match="shape= is for a raw address"):
        nccl_ep.Tensor(a, shape=(3, 2))


def _described(x, writable=False):
    """What a call passes the library for x: its descriptor's address and (data, sizes, datatype)."""
    from goep.ep import _lib
    from goep.ep.tensor import address_of

    keep = []
    at = address_of(x, "x", writable, keep)
    c = _lib.Tensor_c.from_address(at)
    return at, (c.data, tuple(c.sizes[i] for i in range(c.ndim)), c.datatype)


def test_calls_describe_an_unchanged_array_once():
    a = np.zeros((4, 6), np.float32)
    at, d = _described(a)
    assert d == (a.ctypes.data, (4, 6), nccl_ep.FLOAT32)
    assert _described(a) == (at, d) and _described(a, writable=True) == (at, d)
    t = torch.zeros(3, 5, dtype=torch.bfloat16)
    at, d = _described(t)
    assert d == (t.data_ptr(), (3, 5), nccl_ep.BFLOAT16) and _described(t) == (at, d)


def test_calls_describe_an_array_changed_in_place_anew():
    """Whatever a program does to an array or a tensor between calls, the call
    describes it as it is: the descriptors a call reuses are checked against it."""
    a = np.zeros((4, 6), np.float32)
    _described(a)
    a.shape = (6, 4)
    assert _described(a)[1] == (a.ctypes.data, (6, 4), nccl_ep.FLOAT32)
    a.dtype = np.int32
    assert _described(a)[1] == (a.ctypes.data, (6, 4), nccl_ep.INT32)
    b = np.ones(24, np.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # numpy: "an inherently unsafe operation"
        a.data = b.data
    assert _described(a)[1] == (b.ctypes.data, (6, 4), nccl_ep.INT32)
    a.strides = (4, 24)
    with pytest.raises(nccl_ep.NcclInvalid, match="not C-contiguous"):
        _described(a)
    c = np.zeros(8, np.float32)
    _described(c, writable=True)
    c.setflags(write=False)
    assert _described(c)[1][0] == c.ctypes.data
    with pytest.raises(nccl_ep.NcclInvalid, match="x is read-only"):
        _described(c, writable=True)
    t = torch.zeros(4, 6)
    _described(t)
    t.resize_(8, 6)
    assert _described(t)[1] == (t.data_ptr(), (8, 6), nccl_ep.FLOAT32)
    t.set_(torch.ones(2, 3, dtype=torch.float32))
    assert _described(t)[1] == (t.data_ptr(), (2, 3), nccl_ep.FLOAT32)
    t.transpose_(0, 1)
    with pytest.raises(nccl_ep.NcclInvalid, match="not contiguous"):
        _described(t)


def test_a_described_array_that_dies_is_forgotten():
    from goep.ep import tensor

    a = np.zeros(5, np.float32)
    _described(a)
    oid = id(a)
    assert oid in tensor._described
    del a
    gc.collect()
    assert oid not in tensor._described
    # A new array, wherever it lands, is described as itself.
    for n in range(1, 50):
        b = np.zeros(n, np.uint16)
        assert _described(b)[1] == (b.ctypes.data, (n,), nccl_ep.BFLOAT16)
        del b


def test_a_calls_descriptors_outlive_the_cache():
    """The cache may drop an entry in the middle of a call (full, or its array
    changed): the call itself holds every descriptor whose address it passes."""
    from goep.ep import _lib, tensor

    a, b = np.zeros((3, 5), np.float32), torch.zeros(2, 4)
    for x in (a, b):
        tensor.address_of(x, "x", False, [])  # described and cached
        for keep in ([], []):  # a hit, then a miss after the cache was dropped
            at = tensor.address_of(x, "x", False, keep)
            tensor._described.clear()
            gc.collect()
            held = {ctypes.addressof(k if isinstance(k, _lib.Tensor_c) else k._c) for k in keep}
            assert at in held
            c = _lib.Tensor_c.from_address(at)
            assert c.data == (x.ctypes.data if x is a else x.data_ptr())
            assert tuple(c.sizes[i] for i in range(c.ndim)) == tuple(x.shape)


def test_each_thread_fills_call_structs_of_its_own():
    """A call fills C structs it reuses; a call on another thread (ctypes lets
    threads run during a call) must never write into those another call reads."""
    import threading

    from goep.ep.handle import CallStructs

    c = CallStructs()
    mine, theirs = c.s, []
    t = threading.Thread(target=lambda: theirs.append(c.s))
    t.start()
    t.join()
    assert c.s is mine and theirs[0] is not mine
    assert {theirs[0].din_at, theirs[0].cin_at, theirs[0].handle_at}.isdisjoint({mine.din_at, mine.cin_at, mine.handle_at})


def test_goep_ep_does_not_import_torch():
    """A program that never imports torch does not get it from goep.ep."""
    code = ("import mpi4py; mpi4py.rc.initialize = False\n"
            "import sys, numpy as np, goep.ep as e\n"
            "e.Tensor(np.zeros(3, np.float32))\n"
            "assert 'torch' not in sys.modules, 'goep.ep imported torch'\n")
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ, GOEP_EP_ABORT_ON_EXCEPTION="0"))


BAD = {
    "torch not contiguous": (lambda st: torch.from_numpy(np.ascontiguousarray(st.x.T).view(np.int16)).view(torch.bfloat16).t(),
                             "inputs.tokens is a torch tensor that is not contiguous"),
    "torch off the host": (lambda st: torch.zeros(st.x.shape, dtype=torch.bfloat16, device="meta"),
                           "inputs.tokens is a torch tensor on meta, not in host memory"),
    "CUDA array interface": (lambda st: CUDAInterface(st.x.shape),
                             "inputs.tokens is a CUDAInterface with __cuda_array_interface__ (device memory)"),
    "DLPack kDLCUDA": (lambda st: DLPackOnDevice(2), "is in kDLCUDA memory"),
}


@pytest.fixture
def steps(comm, request):
    st = Steps(comm, request.param)
    yield st
    if st.group._ptr:
        st.group.destroy()


@pytest.mark.parametrize("steps", [LL, HT], ids=["ll", "ht"], indirect=True)
@pytest.mark.parametrize("bad", BAD.keys())
def test_refused_tensor_fails_the_dispatch_everywhere(steps, bad):
    """One rank passes tokens goep cannot read in place: its dispatch raises
    NcclInvalid naming them, every other rank's raises NcclRemoteError naming
    that rank, and the next steps combine right values on every rank."""
    st = steps
    make, reason = BAD[bad]
    h = st.handle()
    try:
        if st.me == st.bad:
            with pytest.raises(nccl_ep.NcclInvalid, match=re.escape(reason)):
                st.dispatch(h, tokens=make(st))
        else:
            with pytest.raises(nccl_ep.NCCLError) as e:
                st.dispatch(h)
            st.refused_by_bad(e.value, reason)
    finally:
        h.destroy()
    for factor in (2, 4):
        st.round(factor, f"the step after a refused {bad} (factor {factor})")


@pytest.mark.parametrize("steps", [LL, HT], ids=["ll", "ht"], indirect=True)
def test_refused_combine_output_fails_everywhere(steps):
    """The same at combine: a CUDA-interface output on one rank."""
    st = steps
    h = st.handle()
    try:
        st.dispatch(h)
        reason = "outputs.tokens is a CUDAInterface with __cuda_array_interface__"
        if st.me == st.bad:
            with pytest.raises(nccl_ep.NcclInvalid, match=reason):
                st.combine(h, 1, out=CUDAInterface((st.T, st.s.hidden)))
        else:
            with pytest.raises(nccl_ep.NCCLError) as e:
                st.combine(h, 1)
            st.refused_by_bad(e.value, reason)
    finally:
        h.destroy()
    for factor in (2, 4):
        st.round(factor, f"the step after a refused combine (factor {factor})")
