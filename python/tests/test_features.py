"""The engine's optional features through goep.ep: FP8 dispatch (cast by the
engine, or the caller's codes forwarded), forwarded NVFP4 rows, the FP8 and
NVFP4 combines, HT's expert-major and LL's rank-major layouts. What each rank
receives is checked against a reference computed here with numpy from the
definitions (the e4m3 cast of ep.Quantize, the NVFP4 cast of docs/ep.md, the
layouts of nccl.ep's documentation), never from goep."""

import numpy as np
import pytest

import ep_reference as ref
import goep.ep as nccl_ep
import test_round
from test_round import decode, encode, group_for

LL, HT = nccl_ep.Algorithm.LOW_LATENCY, nccl_ep.Algorithm.HIGH_THROUGHPUT
DS, FWD = nccl_ep.DispatchQuantizationRecipe.DS_FP8E3M4, nccl_ep.DispatchQuantizationRecipe.FWD
FWD_NVFP4 = nccl_ep.DispatchQuantizationRecipe.FWD_NVFP4
E4M3, FP4X2 = nccl_ep.DataType.FLOAT8E4M3, nccl_ep.DataType.FLOAT4X2
NVFP4 = nccl_ep.CombineQuantizationRecipe.NVFP4


# --- e4m3 from its definition ------------------------------------------------------------------------------------

def _e4m3_values():
    """The 127 finite non-negative e4m3 values, by code (0..126)."""
    v = np.zeros(127, dtype=np.float64)
    for c in range(127):
        e, m = c >> 3, c & 7
        v[c] = m / 512 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
    return v


E4M3_VALUES = _e4m3_values()


def e4m3(v: np.ndarray) -> np.ndarray:
    """float32 v to e4m3 codes: nearest, ties to the even code, saturating at 448."""
    v = np.asarray(v, dtype=np.float32)
    a = np.abs(v).astype(np.float64)
    hi = np.clip(np.searchsorted(E4M3_VALUES, a), 1, 126)
    lo = hi - 1
    dlo, dhi = a - E4M3_VALUES[lo], E4M3_VALUES[hi] - a
    code = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    code = np.where(a >= E4M3_VALUES[126], 126, code)
    sign = (v.view(np.uint32) >> 31).astype(np.uint8) << 7
    return (sign | code.astype(np.uint8)).astype(np.uint8)


def decode_e4m3(q: np.ndarray) -> np.ndarray:
    q = np.asarray(q, dtype=np.uint8)
    v = E4M3_VALUES[np.minimum(q & 0x7F, 126)].astype(np.float32)
    return np.where(q & 0x80, -v, v).astype(np.float32)


def quantize(x: np.ndarray, ue8m0: bool):
    """Rows x [n, H] float32 to (codes [n, H] uint8, scales [n, ceil(H/128)] float32): per group of 128
    elements, s = max(amax/448, 2^-126), rounded up to a power of two with ue8m0, codes = e4m3(x * (1/s))."""
    x = np.asarray(x, dtype=np.float32)
    n, H = x.shape
    G = (H + 127) // 128
    codes = np.zeros((n, H), dtype=np.uint8)
    scales = np.zeros((n, G), dtype=np.float32)
    for g in range(G):
        part = x[:, g * 128:(g + 1) * 128]
        amax = np.max(np.abs(part), axis=1).astype(np.float32) if part.size else np.zeros(n, np.float32)
        s = np.maximum(amax / np.float32(448), np.float32(2.0 ** -126)).astype(np.float32)
        if ue8m0:
            bits = s.view(np.uint32)
            up = np.where(bits & 0x7FFFFF, (bits & 0x7F800000) + 0x800000, bits).astype(np.uint32)
            s = up.view(np.float32)
        scales[:, g] = s
        inv = (np.float32(1) / s).astype(np.float32)
        codes[:, g * 128:(g + 1) * 128] = e4m3((part * inv[:, None]).astype(np.float32))
    return codes, scales


def dequantize(codes, scales):
    n, H = codes.shape
    return (decode_e4m3(codes) * np.repeat(scales, 128, axis=1)[:, :H]).astype(np.float32)


def test_e4m3_reference_itself():
    """The reference cast against values whose codes are known."""
    assert list(e4m3(np.array([0, 1, -1, 448, 500, 2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -10, 1.0625, 1.1875],
                               dtype=np.float32))) == [0, 0x38, 0xB8, 0x7E, 0x7E, 1, 0, 2, 0x38, 0x3A]


# --- inputs ------------------------------------------------------------------------------------------------------

def rows_of(rank: int, T: int, H: int, dtype) -> np.ndarray:
    """Token values with a spread of magnitudes (so that scales and rounding matter), float32 [T, H], as the
    element type holds them (bfloat16-rounded for bfloat16 groups)."""
    t = np.arange(T, dtype=np.float64)[:, None]
    h = np.arange(H, dtype=np.float64)[None, :]
    v = (np.sin(rank * 1.7 + t * 0.37 + h * 0.61) * (1 + (h % 7)) * 2.0 ** ((t % 5) - 2)).astype(np.float32)
    return ref.from_bf16(ref.to_bf16(v)) if dtype == nccl_ep.BFLOAT16 else v


def shape(comm, tokens=10, hidden=200, topk=3, experts_per_rank=3):
    return test_round.shape(comm, tokens, hidden, topk, experts_per_rank)


def ll_rows(s, me):
    """LL EXPERT_MAJOR: per local expert, the (source, token) of its rows, in order."""
    return ref.received_ll(s, me)


def rm_rows(s, me):
    """LL RANK_MAJOR: per source rank, (token, local ids [K] (-1 elsewhere), weights [K] (0 elsewhere)) of
    each token of that rank with an expert here, in token order."""
    out = [[] for _ in range(s.nranks)]
    for src, t, ids, w in ref.received_ht(s, me):
        out[src].append((t, ids, w))
    return out


def em_rows(s, me):
    """HT EXPERT_MAJOR: per local expert, (source, token, weight) of each row, by source then token."""
    L = s.local_experts
    out = [[] for _ in range(L)]
    for src in range(s.nranks):
        e, w = ref.experts(s, src), ref.weights(s.tokens_of(src), s.topk)
        for t in range(s.tokens_of(src)):
            for k in range(s.topk):
                if e[t, k] >= 0 and e[t, k] // L == me:
                    out[e[t, k] - me * L].append((src, t, w[t, k]))
    return out


def close(got, want, dtype):
    """The combine of dequantized rows, summed in float32 and rounded once to the element type: within a
    rounding of the element type of the float32 reference."""
    tol = 2.0 ** -7 if dtype == nccl_ep.BFLOAT16 else 2.0 ** -20
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * float(np.max(np.abs(want), initial=1)))


# --- FP8 dispatch ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("round_scales", [0, 1], ids=["f32-scales", "ue8m0"])
@pytest.mark.parametrize("algorithm,dtype", [(LL, nccl_ep.BFLOAT16), (HT, nccl_ep.FLOAT32), (HT, nccl_ep.BFLOAT16)],
                         ids=["ll-bf16", "ht-f32", "ht-bf16"])
def test_fp8_dispatch(comm, algorithm, dtype, round_scales):
    """DS_FP8E3M4: every received row's e4m3 codes and scales are the reference cast of its source row (bit for
    bit, hidden 200: a short last group); the combine of their dequantized values gives the tokens."""
    s = shape(comm)
    me, R = comm.Get_rank(), comm.Get_size()
    T, H, K, L = s.tokens_of(me), s.hidden, s.topk, s.local_experts
    G = (H + 127) // 128
    ll = algorithm == LL
    with group_for(comm, s, algorithm, dtype, dispatch_quant=DS, dispatch_round_scales=round_scales) as group:
        handle = group.create_handle(nccl_ep.Layout.EXPERT_MAJOR if ll else nccl_ep.Layout.FLAT, ref.experts(s, me))
        x, w = rows_of(me, T, H, dtype), ref.weights(T, K)
        lead = (L, R * s.max_tokens) if ll else (R * s.max_tokens,)
        codes = np.full(lead + (H,), 0xFF, dtype=np.uint8)
        scales = np.full(lead + (G,), -1, dtype=np.float32)
        counts, total = np.zeros(L, dtype=np.int32), np.zeros(1, dtype=np.int64)
        outs = nccl_ep.DispatchOutputs(tokens=nccl_ep.Tensor(codes, dtype=E4M3), scales=scales)
        if not ll:
            recv_w = np.zeros((R * s.max_tokens, K), dtype=np.float32)
            outs.topk_weights = recv_w
        handle.dispatch(nccl_ep.DispatchInputs(tokens=encode(x, dtype), topk_weights=w), outs,
                        layout_info=nccl_ep.LayoutInfo(expert_counters=counts, recv_total_counter=total),
                        config=nccl_ep.DispatchConfig(quantization_recipe=DS, round_scales=round_scales))
        if ll:
            y = np.zeros((L, R * s.max_tokens, H), dtype=np.float32)
            for l, rows in enumerate(ll_rows(s, me)):
                assert counts[l] == len(rows)
                for j, (src, t) in enumerate(rows):
                    wc, ws = quantize(rows_of(src, t + 1, H, dtype)[t:t + 1], round_scales)
                    np.testing.assert_array_equal(codes[l, j], wc[0], err_msg=f"expert {l} row {j} codes")
                    np.testing.assert_array_equal(scales[l, j], ws[0], err_msg=f"expert {l} row {j} scales")
                y[l, :len(rows)] = dequantize(codes[l, :len(rows)], scales[l, :len(rows)])
            want = np.zeros((T, H), dtype=np.float32)
            e = ref.experts(s, me)
            xq = dequantize(*quantize(x, round_scales))
            xq = decode(encode(xq, dtype), dtype)
            for k in range(K):
                want += np.where(e[:, k:k + 1] >= 0, w[:, k:k + 1], 0).astype(np.float32) * xq
        else:
            rows = ref.received_ht(s, me)
            assert total[0] == len(rows)
            y = np.zeros((R * s.max_tokens, H), dtype=np.float32)
            for j, (src, t, _, wt) in enumerate(rows):
                wc, ws = quantize(rows_of(src, t + 1, H, dtype)[t:t + 1], round_scales)
                np.testing.assert_array_equal(codes[j], wc[0], err_msg=f"row {j} (rank {src} token {t}) codes")
                np.testing.assert_array_equal(scales[j], ws[0], err_msg=f"row {j} scales")
                np.testing.assert_array_equal(recv_w[j], wt)
                y[j] = dequantize(codes[j:j + 1], scales[j:j + 1])[0] * wt.sum()
            want = np.zeros((T, H), dtype=np.float32)
            e = ref.experts(s, me)
            xq = dequantize(*quantize(x, round_scales))
            for r in range(R):  # each rank the token went to returns its rows times the weights of its slots there
                mine = (e >= 0) & (e // L == r)
                want += decode(encode(xq * np.where(mine, w, 0).sum(axis=1, keepdims=True), dtype), dtype)
        out = np.zeros((T, H), dtype=np.uint16 if dtype == nccl_ep.BFLOAT16 else np.float32)
        handle.combine(nccl_ep.CombineInputs(tokens=encode(y, dtype)),
                       nccl_ep.CombineOutputs(tokens=out, topk_weights=w if ll else None))
        close(decode(out, dtype), want, dtype)
        # A cached dispatch of the handle (its routing again) casts the same rows the same way.
        codes2 = np.zeros_like(codes)
        scales2 = np.zeros_like(scales)
        outs2 = nccl_ep.DispatchOutputs(tokens=nccl_ep.Tensor(codes2, dtype=E4M3), scales=scales2)
        handle.dispatch(nccl_ep.DispatchInputs(tokens=encode(x, dtype)), outs2,
                        layout_info=nccl_ep.LayoutInfo(expert_counters=counts))
        valid = [np.s_[l, :counts[l]] for l in range(L)] if ll else [np.s_[:total[0]]]
        for v in valid:
            np.testing.assert_array_equal(codes2[v], codes[v])
            np.testing.assert_array_equal(scales2[v], scales[v])
        if ll:
            handle.combine(nccl_ep.CombineInputs(tokens=encode(y, dtype)),
                           nccl_ep.CombineOutputs(tokens=out, topk_weights=w))
        handle.destroy()


def test_fp8_dispatch_refusals(comm):
    """A recipe other than the group's, scales where none travel, and an FP8 group's outputs in the token type are
    refused by name on every rank; the group stays usable."""
    s = shape(comm)
    me, R = comm.Get_rank(), comm.Get_size()
    T, H, K, L = s.tokens_of(me), s.hidden, s.topk, s.local_experts
    G = (H + 127) // 128
    x, w = ref.to_bf16(rows_of(me, T, H, nccl_ep.BFLOAT16)), ref.weights(T, K)
    with group_for(comm, s, LL) as group:  # a group without a dispatch recipe
        handle = group.create_handle(nccl_ep.Layout.EXPERT_MAJOR, ref.experts(s, me))
        recv = np.zeros((L, R * s.max_tokens, H), dtype=np.uint16)
        counts = np.zeros(L, dtype=np.int32)
        with pytest.raises(nccl_ep.NCCLError, match="dispatch_quant"):
            handle.dispatch(nccl_ep.DispatchInputs(tokens=x, topk_weights=w), nccl_ep.DispatchOutputs(tokens=recv),
                            layout_info=nccl_ep.LayoutInfo(expert_counters=counts),
                            config=nccl_ep.DispatchConfig(quantization_recipe=DS))
        with pytest.raises(nccl_ep.NCCLError, match="outputs->scales must be NULL"):
            handle.dispatch(nccl_ep.DispatchInputs(tokens=x, topk_weights=w),
                            nccl_ep.DispatchOutputs(tokens=recv, scales=np.zeros((L, R * s.max_tokens, G), np.float32)),
                            layout_info=nccl_ep.LayoutInfo(expert_counters=counts))
        handle.dispatch(nccl_ep.DispatchInputs(tokens=x, topk_weights=w), nccl_ep.DispatchOutputs(tokens=recv),
                        layout_info=nccl_ep.LayoutInfo(expert_counters=counts))
        assert list(counts) == [len(r) for r in ll_rows(s, me)]
        handle.destroy()
    with group_for(comm, s, LL, dispatch_quant=DS) as group:
        handle = group.create_handle(nccl_ep.Layout.EXPERT_MAJOR, ref.experts(s, me))
        counts = np.zeros(L, dtype=np.int32)
        with pytest.raises(nccl_ep.NCCLError, match="float8e4m3"):  # bfloat16 outputs of an FP8 dispatch
            handle.dispatch(nccl_ep.DispatchInputs(tokens=x, topk_weights=w),
                            nccl_ep.DispatchOutputs(tokens=np.zeros((L, R * s.max_tokens, H), np.uint16)),
                            layout_info=nccl_ep.LayoutInfo(expert_counters=counts))
        with pytest.raises(nccl_ep.NCCLError, match="round_scales"):
            handle.dispatch(nccl_ep.DispatchInputs(tokens=x, topk_weights=w),
                            nccl_ep.DispatchOutputs(tokens=nccl_ep.Tensor(np.zeros((L, R * s.max_tokens, H), np.uint8),
                                                                          dtype=E4M3),
                                                    scales=np.zeros((L, R * s.max_tokens, G), np.float32)),
                            layout_info=nccl_ep.LayoutInfo(expert_counters=counts),
                            config=nccl_ep.DispatchConfig(quantization_recipe=DS, round_scales=1))
        with pytest.raises(nccl_ep.NCCLError, match="goepEpHandleRecvTokens|outputs->tokens is NULL"):
            handle.dispatch(nccl_ep.DispatchInputs(tokens=x, topk_weights=w), nccl_ep.DispatchOutputs(tokens=None),
                            layout_info=nccl_ep.LayoutInfo(expert_counters=counts))
        handle.destroy()


@pytest.mark.parametrize("algorithm", [LL, HT], ids=["ll", "ht"])
def test_fp8_forward(comm, algorithm):
    """QUANT_FWD: the caller's e4m3 codes and float32 scales arrive byte for byte; NCCL EP's other forwarded
    payloads (bfloat16 rows, uint8 scales, another scale count) are refused by name."""
    s = shape(comm)
    me, R = comm.Get_rank(), comm.Get_size()
    T, H, K, L = s.tokens_of(me), s.hidden, s.topk, s.local_experts
    G = (H + 127) // 128
    ll = algorithm == LL

    def caller_fp8(rank, n):  # any codes and positive scales: not what the engine's cast would make
        c, sc = quantize(rows_of(rank, n, H, nccl_ep.FLOAT32), False)
        return c, (sc * np.float32(1.5)).astype(np.float32)

    with group_for(comm, s, algorithm, dispatch_quant=FWD) as group:
        handle = group.create_handle(nccl_ep.Layout.EXPERT_MAJOR if ll else nccl_ep.Layout.FLAT, ref.experts(s, me))
        mine, my_scales = caller_fp8(me, T)
        w = ref.weights(T, K)
        lead = (L, R * s.max_tokens) if ll else (R * s.max_tokens,)
        codes = np.zeros(lead + (H,), dtype=np.uint8)
        scales = np.zeros(lead + (G,), dtype=np.float32)
        counts, total = np.zeros(L, dtype=np.int32), np.zeros(1, dtype=np.int32)
        info = nccl_ep.LayoutInfo(expert_counters=counts, recv_total_counter=total)
        outs = nccl_ep.DispatchOutputs(tokens=nccl_ep.Tensor(codes, dtype=E4M3), scales=scales)
        with pytest.raises(nccl_ep.NCCLError, match="forward"):
            handle.dispatch(nccl_ep.DispatchInputs(tokens=ref.to_bf16(rows_of(me, T, H, nccl_ep.BFLOAT16)),
                                                   topk_weights=w, scales=my_scales), outs, layout_info=info)
        with pytest.raises(nccl_ep.NCCLError, match="uint8"):
            handle.dispatch(nccl_ep.DispatchInputs(tokens=nccl_ep.Tensor(mine, dtype=E4M3), topk_weights=w,
                                                   scales=np.full((T, G), 127, np.uint8)), outs, layout_info=info)
        with pytest.raises(nccl_ep.NCCLError, match="scales a row"):
            handle.dispatch(nccl_ep.DispatchInputs(tokens=nccl_ep.Tensor(mine, dtype=E4M3), topk_weights=w,
                                                   scales=np.ones((T, 4 * G), np.float32)), outs, layout_info=info)
        handle.dispatch(nccl_ep.DispatchInputs(tokens=nccl_ep.Tensor(mine, dtype=E4M3), topk_weights=w,
                                               scales=my_scales), outs, layout_info=info,
                        config=nccl_ep.DispatchConfig(quantization_recipe=FWD))
        if ll:
            for l, rows in enumerate(ll_rows(s, me)):
                assert counts[l] == len(rows)
                for j, (src, t) in enumerate(rows):
                    c, sc = caller_fp8(src, t + 1)
                    np.testing.assert_array_equal(codes[l, j], c[t])
                    np.testing.assert_array_equal(scales[l, j], sc[t])
            y = np.zeros((L, R * s.max_tokens, H), dtype=np.uint16)
            handle.combine(nccl_ep.CombineInputs(tokens=y), nccl_ep.CombineOutputs(tokens=np.zeros((T, H), np.uint16),
                                                                                 topk_weights=w))
        else:
            rows = ref.received_ht(s, me)
            assert total[0] == len(rows)
            for j, (src, t, _, _) in enumerate(rows):
                c, sc = caller_fp8(src, t + 1)
                np.testing.assert_array_equal(codes[j], c[t])
                np.testing.assert_array_equal(scales[j], sc[t])
        handle.destroy()


# --- the FP8 combine ---------------------------------------------------------------------------------------------

def test_fp8_combine(comm):
    """combine_quant FP8 (LL): the expert outputs travel as e4m3 codes and scales; the combined tokens are the
    weighted sums of the quantized outputs (within the element type's rounding), and a combine naming another
    recipe is refused by name."""
    s = shape(comm)
    me, R = comm.Get_rank(), comm.Get_size()
    T, H, K, L = s.tokens_of(me), s.hidden, s.topk, s.local_experts
    with group_for(comm, s, LL, nccl_ep.FLOAT32, combine_quant=nccl_ep.CombineQuantizationRecipe.FP8) as group:
        handle = group.create_handle(nccl_ep.Layout.EXPERT_MAJOR, ref.experts(s, me))
        x, w = rows_of(me, T, H, nccl_ep.FLOAT32), ref.weights(T, K)
        recv = np.zeros((L, R * s.max_tokens, H), dtype=np.float32)
        counts = np.zeros(L, dtype=np.int32)
        handle.dispatch(nccl_ep.DispatchInputs(tokens=x, topk_weights=w), nccl_ep.DispatchOutputs(tokens=recv),
                        layout_info=nccl_ep.LayoutInfo(expert_counters=counts))
        out = np.zeros((T, H), dtype=np.float32)
        with pytest.raises(nccl_ep.NCCLError, match="quant_recipe"):
            handle.combine(nccl_ep.CombineInputs(tokens=recv), nccl_ep.CombineOutputs(tokens=out),
                           config=nccl_ep.CombineConfig(quantization_recipe=nccl_ep.CombineQuantizationRecipe.FP8_UE8M0))
        handle.combine(nccl_ep.CombineInputs(tokens=recv), nccl_ep.CombineOutputs(tokens=out),
                       config=nccl_ep.CombineConfig(quantization_recipe=nccl_ep.CombineQuantizationRecipe.FP8))
        e = ref.experts(s, me)
        xq = dequantize(*quantize(x, False))
        want = np.zeros((T, H), dtype=np.float32)
        for k in range(K):
            want += np.where(e[:, k:k + 1] >= 0, w[:, k:k + 1], 0).astype(np.float32) * xq
        close(out, want, nccl_ep.FLOAT32)
        handle.destroy()


# --- NVFP4 from its definition -----------------------------------------------------------------------------------

E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float64)


def e2m1(a: np.ndarray) -> np.ndarray:
    """The e2m1 magnitude nearest to each a >= 0 (float32), ties to the even code, saturating at 6."""
    d = np.abs(np.asarray(a, dtype=np.float64)[..., None] - E2M1_VALUES)
    nearest = d == d.min(axis=-1, keepdims=True)
    even = nearest & (np.arange(8) % 2 == 0)
    idx = np.where(even.any(axis=-1), even.argmax(axis=-1), nearest.argmax(axis=-1))
    return E2M1_VALUES[idx].astype(np.float32)


def nvfp4_values(x: np.ndarray) -> np.ndarray:
    """The values of rows x [n, H] (float32) after the NVFP4 cast, in float32: row scale g = amax/2688; per 16
    elements es = e4m3(amax_b/6/g) * g; each element the nearest e2m1 of x/es, times es (0 where es is 0)."""
    x = np.asarray(x, dtype=np.float32)
    amax = np.max(np.abs(x), axis=1)
    g = (amax / np.float32(2688)).astype(np.float32)
    out = np.zeros_like(x)
    with np.errstate(divide="ignore", invalid="ignore"):
        for b in range(0, x.shape[1], 16):
            blk = x[:, b:b + 16]
            bmax = np.max(np.abs(blk), axis=1)
            sc = np.where(g > 0, (bmax / np.float32(6)).astype(np.float32) / g, np.float32(0)).astype(np.float32)
            es = (decode_e4m3(e4m3(sc)) * g).astype(np.float32)
            m = (e2m1(np.abs(blk / es[:, None]).astype(np.float32)) * es[:, None]).astype(np.float32)
            m = np.where(es[:, None] > 0, m, np.float32(0))
            out[:, b:b + 16] = np.where(blk < 0, -m, m)
    return out


def test_nvfp4_reference_itself():
    """The reference cast on a row whose values are known: amax 2688 makes the row scale 1."""
    x = np.zeros((1, 32), dtype=np.float32)
    # Block 0: amax 2688, scale e4m3(2688/6) = 448; the codes of 6, -3, 0.75 and 1.25 (ties: the even codes 1 and 1),
    # 5 (a tie: 4), 0.2 (below 0.25: 0), times 448.
    x[0, :6] = np.array([6, -3, 0.75, 1.25, 5, 0.2], dtype=np.float32) * 448
    # Block 1: amax 56, scale e4m3(56/6 = 9.33) = 9; 56/9 = 6.2 saturates at 6.
    x[0, 16:] = 56
    v = nvfp4_values(x)[0]
    assert list(v[:6]) == [2688, -1344, 448, 448, 1792, 0] and not v[6:16].any()
    assert list(v[16:]) == [54] * 16


FP4_H = 64  # NVFP4 rows: hidden a multiple of 32


def fp4_rows(rank: int, T: int):
    """The caller's NVFP4 rows of rank: code bytes [T, H/2] (any byte is two e2m1 codes) and e4m3 scale bytes
    [T, H/16], as a quantising kernel of its own would have made them."""
    t = np.arange(T)[:, None]
    codes = ((rank * 37 + t * 11 + np.arange(FP4_H // 2)[None, :] * 3 + 1) % 256).astype(np.uint8)
    scales = ((rank * 29 + t * 7 + np.arange(FP4_H // 16)[None, :] * 5 + 2) % 256).astype(np.uint8)
    return codes, scales


def refused(me: int, bad: int, match: str):
    """pytest.raises for a collective call that rank bad refuses: NcclInvalid there, NcclRemoteError naming it
    on the others, both saying match."""
    if me == bad:
        return pytest.raises(nccl_ep.NcclInvalid, match=match)
    return pytest.raises(nccl_ep.NcclRemoteError, match=f"rank {bad} refused the call.*{match}")


@pytest.mark.parametrize("algorithm", [LL, HT], ids=["ll", "ht"])
def test_nvfp4_forward(comm, algorithm):
    """GroupConfig(dispatch_quant=FWD_NVFP4), dispatched with nccl.ep's FWD: the caller's FLOAT4X2 codes and e4m3
    scale bytes arrive byte for byte at their (source, token) places. One rank's bad payload (e4m3 rows, a logical
    hidden where the packed one goes, float32 scales, another scale count, output scales of another type) is
    refused there by name and on the others naming that rank, writing nothing; the group goes on."""
    s = shape(comm, hidden=FP4_H)
    me, R = comm.Get_rank(), comm.Get_size()
    T, H, K, L = s.tokens_of(me), s.hidden, s.topk, s.local_experts
    P, S, bad = H // 2, H // 16, R - 1
    ll = algorithm == LL
    scale_type = nccl_ep.DataType.UINT8 if ll else E4M3  # nccl.ep takes either one-byte type for them
    with group_for(comm, s, algorithm, dispatch_quant=FWD_NVFP4) as group:
        handle = group.create_handle(nccl_ep.Layout.EXPERT_MAJOR if ll else nccl_ep.Layout.FLAT, ref.experts(s, me))
        mine, my_scales = fp4_rows(me, T)
        w = ref.weights(T, K)
        lead = (L, R * s.max_tokens) if ll else (R * s.max_tokens,)
        codes = np.full(lead + (P,), 0xEE, dtype=np.uint8)
        scales = np.full(lead + (S,), 0xEE, dtype=np.uint8)
        counts, total = np.zeros(L, dtype=np.int32), np.zeros(1, dtype=np.int64)
        info = nccl_ep.LayoutInfo(expert_counters=counts if ll else None, recv_total_counter=total)
        outs = nccl_ep.DispatchOutputs(tokens=nccl_ep.Tensor(codes, dtype=FP4X2),
                                       scales=nccl_ep.Tensor(scales, dtype=scale_type))
        good = nccl_ep.DispatchInputs(tokens=nccl_ep.Tensor(mine, dtype=FP4X2), topk_weights=w,
                                      scales=nccl_ep.Tensor(my_scales, dtype=scale_type))
        cfg = nccl_ep.DispatchConfig(quantization_recipe=FWD)
        other = nccl_ep.DataType.UINT8 if scale_type == E4M3 else E4M3
        bads = [
            (nccl_ep.DispatchInputs(tokens=nccl_ep.Tensor(np.zeros((T, H), np.uint8), dtype=E4M3), topk_weights=w,
                                    scales=good.scales), outs, "this group forwards NVFP4 rows"),
            (nccl_ep.DispatchInputs(tokens=nccl_ep.Tensor(np.zeros((T, H), np.uint8), dtype=FP4X2), topk_weights=w,
                                    scales=good.scales), outs, "a float4x2 element holds two values"),
            (nccl_ep.DispatchInputs(tokens=good.tokens, topk_weights=w, scales=np.ones((T, S), np.float32)), outs,
             "inputs->scales has datatype float32"),
            (nccl_ep.DispatchInputs(tokens=good.tokens, topk_weights=w,
                                    scales=nccl_ep.Tensor(np.zeros((T, S // 2), np.uint8), dtype=scale_type)), outs,
             "scales a row"),
            (good, nccl_ep.DispatchOutputs(tokens=outs.tokens, scales=nccl_ep.Tensor(scales, dtype=other)),
             "forwarded scale bytes arrive in the type they were given"),
        ]
        for inputs, outputs, says in bads:
            with refused(me, bad, says):
                handle.dispatch(inputs if me == bad else good, outputs if me == bad else outs, layout_info=info,
                                config=cfg)
        assert (codes == 0xEE).all() and (scales == 0xEE).all(), "a refused dispatch wrote into its outputs"
        handle.dispatch(good, outs, layout_info=info, config=cfg)
        y = np.zeros(lead + (H,), dtype=np.uint16)
        if ll:
            for l, rows in enumerate(ll_rows(s, me)):
                assert counts[l] == len(rows)
                for j, (src, t) in enumerate(rows):
                    c, sc = fp4_rows(src, t + 1)
                    np.testing.assert_array_equal(codes[l, j], c[t], err_msg=f"expert {l} row {j} (rank {src} token {t})")
                    np.testing.assert_array_equal(scales[l, j], sc[t], err_msg=f"expert {l} row {j} scales")
                    y[l, j] = ref.to_bf16(ref.values(src, t + 1, H)[t])
            with pytest.raises(nccl_ep.NcclInvalid, match="float4x2 codes with their scales"):
                handle.recv_tokens()
        else:
            rows = ref.received_ht(s, me)
            assert total[0] == len(rows)
            for j, (src, t, _, wt) in enumerate(rows):
                c, sc = fp4_rows(src, t + 1)
                np.testing.assert_array_equal(codes[j], c[t], err_msg=f"row {j} (rank {src} token {t})")
                np.testing.assert_array_equal(scales[j], sc[t], err_msg=f"row {j} scales")
                y[j] = ref.to_bf16(ref.values(src, t + 1, H)[t] * wt.sum())
        # The combine of such a group takes the expert outputs in the token type.
        out = np.zeros((T, H), dtype=np.uint16)
        handle.combine(nccl_ep.CombineInputs(tokens=y), nccl_ep.CombineOutputs(tokens=out, topk_weights=w if ll else None))
        np.testing.assert_array_equal(ref.from_bf16(out), ref.combined(s, me))
        handle.destroy()
    # A group forwarding FP8 rows names the recipe that forwards FLOAT4X2 ones.
    with group_for(comm, s, algorithm, dispatch_quant=FWD) as group:
        handle = group.create_handle(nccl_ep.Layout.EXPERT_MAJOR if ll else nccl_ep.Layout.FLAT, ref.experts(s, me))
        with pytest.raises(nccl_ep.NcclInvalid, match="options.dispatch_quant = GOEP_EP_DISP_QUANT_FWD_NVFP4"):
            handle.dispatch(good, nccl_ep.DispatchOutputs(tokens=nccl_ep.Tensor(np.zeros(lead + (H,), np.uint8), dtype=E4M3),
                                                          scales=np.zeros(lead + (4,), np.float32)),
                            layout_info=info, config=cfg)
        handle.destroy()


def expert_out(e: int, src: int, t: int, H: int, dtype) -> np.ndarray:
    """Expert e's output for token t of rank src, float32 [H], as the element type holds it: a spread of
    magnitudes (every third block 64 times smaller, fractions below the integers), so that the NVFP4 scales and
    the codes' rounding matter. The expert's rank and the token's compute it alike."""
    h = np.arange(H)
    v = (ref.values(src, t + 1, H)[t] * np.float32(1 + e / 7) + ((h * 13 + t) % 11) * np.float32(0.0625)).astype(np.float32)
    v = np.where((h // 16) % 3 == 1, v * np.float32(1 / 64), v).astype(np.float32)
    return decode(encode(v[None, :], dtype), dtype)[0]


@pytest.mark.parametrize("dtype", [nccl_ep.BFLOAT16, nccl_ep.FLOAT32], ids=["bf16", "f32"])
def test_nvfp4_combine(comm, dtype):
    """GroupConfig(combine_quant=NVFP4), LL: every combined value is the float32 sum, in top-k order, of weight times
    the NVFP4 values of its expert outputs (the reference cast above), rounded once to the element type: bit for
    bit, with nccl.ep's global scales (2688 / amax per row; one a float32 step off is the same) and without them.
    One rank's scale two steps off its row's, and a scales tensor of another shape, are refused there naming them
    and on the others naming that rank; scales in a group without the NVFP4 combine are refused."""
    s = shape(comm, hidden=FP4_H)
    me, R = comm.Get_rank(), comm.Get_size()
    T, H, K, L = s.tokens_of(me), s.hidden, s.topk, s.local_experts
    bad = R - 1
    with group_for(comm, s, LL, dtype, combine_quant=NVFP4) as group:
        handle = group.create_handle(nccl_ep.Layout.EXPERT_MAJOR, ref.experts(s, me))
        x, w = rows_of(me, T, H, dtype), ref.weights(T, K)
        recv = np.zeros((L, R * s.max_tokens, H), dtype=encode(x, dtype).dtype)
        counts = np.zeros(L, dtype=np.int32)
        dispatch = lambda: handle.dispatch(nccl_ep.DispatchInputs(tokens=encode(x, dtype), topk_weights=w),  # noqa: E731
                                           nccl_ep.DispatchOutputs(tokens=recv),
                                           layout_info=nccl_ep.LayoutInfo(expert_counters=counts))
        dispatch()
        y = np.zeros((L, R * s.max_tokens, H), dtype=np.float32)
        scales = np.full((L, R * s.max_tokens, 1), -1, dtype=np.float32)  # rows past expert_counters are not read
        for l, rows in enumerate(ll_rows(s, me)):
            assert counts[l] == len(rows)
            for j, (src, t) in enumerate(rows):
                y[l, j] = expert_out(me * L + l, src, t, H, dtype)
                amax = np.max(np.abs(y[l, j]))
                scales[l, j, 0] = 0 if amax == 0 else np.float32(2688) / amax  # nccl.ep's contract
        first = next(((l, 0) for l in range(L) if counts[l] > 0), None)
        if first is not None:
            scales[first + (0,)] = np.nextafter(scales[first + (0,)], np.float32(np.inf))  # another division's last bit
        cfg = nccl_ep.CombineConfig(quantization_recipe=NVFP4)
        out = np.zeros((T, H), dtype=encode(x, dtype).dtype)
        outs = nccl_ep.CombineOutputs(tokens=out)

        bad_l = next(l for l in range(L) if ref.received_ll(s, bad)[l])  # where rank bad's first row is
        off = scales.copy()
        if first is not None:
            zero = np.float32(0)  # float32 steps (a Python 0 would make them float64 ones)
            off[first + (0,)] = np.nextafter(np.nextafter(np.nextafter(scales[first + (0,)], zero), zero), zero)
        with refused(me, bad, rf"inputs->scales\[{bad_l}\]\[0\]\[0\] = .*want 2688/amax"):
            handle.combine(nccl_ep.CombineInputs(tokens=encode(y, dtype), scales=off if me == bad else scales), outs,
                           config=cfg)
        with refused(me, bad, "inputs->scales has shape"):
            handle.combine(nccl_ep.CombineInputs(tokens=encode(y, dtype), scales=scales[..., 0] if me == bad else scales),
                           outs, config=cfg)

        e = ref.experts(s, me)
        want = np.zeros((T, H), dtype=np.float32)
        for t in range(T):
            acc = None
            for k in range(K):
                if e[t, k] < 0:
                    continue
                p = (w[t, k] * nvfp4_values(expert_out(e[t, k], me, t, H, dtype)[None, :])[0]).astype(np.float32)
                acc = p if acc is None else (acc + p).astype(np.float32)
            if acc is not None:
                want[t] = acc
        want = decode(encode(want, dtype), dtype)
        handle.combine(nccl_ep.CombineInputs(tokens=encode(y, dtype), scales=scales), outs, config=cfg)
        np.testing.assert_array_equal(decode(out, dtype), want)
        dispatch()  # a cached dispatch, then the combine without scales: goep computes each row's
        out[:] = 0
        handle.combine(nccl_ep.CombineInputs(tokens=encode(y, dtype)), outs)
        np.testing.assert_array_equal(decode(out, dtype), want)
        handle.destroy()
    with group_for(comm, s, LL, dtype) as group:
        handle = group.create_handle(nccl_ep.Layout.EXPERT_MAJOR, ref.experts(s, me))
        x, w = rows_of(me, T, H, dtype), ref.weights(T, K)
        recv = np.zeros((L, R * s.max_tokens, H), dtype=encode(x, dtype).dtype)
        handle.dispatch(nccl_ep.DispatchInputs(tokens=encode(x, dtype), topk_weights=w),
                        nccl_ep.DispatchOutputs(tokens=recv),
                        layout_info=nccl_ep.LayoutInfo(expert_counters=np.zeros(L, dtype=np.int32)))
        out = np.zeros((T, H), dtype=recv.dtype)
        with pytest.raises(nccl_ep.NcclInvalid, match="inputs->scales must be NULL"):
            handle.combine(nccl_ep.CombineInputs(tokens=recv, scales=np.zeros((L, R * s.max_tokens, 1), np.float32)),
                           nccl_ep.CombineOutputs(tokens=out))
        handle.combine(nccl_ep.CombineInputs(tokens=recv), nccl_ep.CombineOutputs(tokens=out))
        handle.destroy()


# --- layouts -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("align", [0, 4])
def test_ht_expert_major(comm, align):
    """HT EXPERT_MAJOR: zone l at expert_offsets[l] holds the rows of (token, expert l) pairs by source then token,
    then zero rows up to the alignment; one weight per row; expert_counters are the padded counts and
    recv_total_counter their sum; the experts apply the weights and combine sums to the reference. A later handle
    of another layout or alignment is refused by name."""
    s = shape(comm, hidden=40)
    me, R = comm.Get_rank(), comm.Get_size()
    T, H, K, L = s.tokens_of(me), s.hidden, s.topk, s.local_experts
    with group_for(comm, s, HT) as group:
        cfg = nccl_ep.HandleConfig(dispatch_output_per_expert_alignment=align)
        handle = group.create_handle(nccl_ep.Layout.EXPERT_MAJOR, ref.experts(s, me), config=cfg)
        slots = R * s.max_tokens * K + L * max(align - 1, 0)
        recv = np.full((slots, H), 0xFFFF, dtype=np.uint16)
        recv_w = np.full(slots, -1, dtype=np.float32)
        counts, offsets, total = np.zeros(L, np.int64), np.zeros(L, np.int32), np.zeros(1, np.int64)
        w = ref.weights(T, K)
        handle.dispatch(nccl_ep.DispatchInputs(tokens=ref.to_bf16(ref.values(me, T, H)), topk_weights=w),
                        nccl_ep.DispatchOutputs(tokens=recv, topk_weights=recv_w),
                        layout_info=nccl_ep.LayoutInfo(expert_counters=counts, expert_offsets=offsets,
                                                       recv_total_counter=total))
        a = max(align, 1)
        start = 0
        for l, rows in enumerate(em_rows(s, me)):
            padded = -(-len(rows) // a) * a
            assert offsets[l] == start and counts[l] == padded, (l, offsets, counts)
            for j, (src, t, wt) in enumerate(rows):
                np.testing.assert_array_equal(ref.from_bf16(recv[start + j]), ref.values(src, t + 1, H)[t])
                assert recv_w[start + j] == wt
            assert not recv[start + len(rows):start + padded].any() and not recv_w[start + len(rows):start + padded].any()
            start += padded
        assert total[0] == start
        y = ref.to_bf16(ref.from_bf16(recv[:start]) * recv_w[:start, None])  # the experts apply the weights
        out = np.zeros((T, H), dtype=np.uint16)
        handle.combine(nccl_ep.CombineInputs(tokens=y), nccl_ep.CombineOutputs(tokens=out))
        np.testing.assert_array_equal(ref.from_bf16(out), ref.combined(s, me))
        with pytest.raises(nccl_ep.NcclInvalid, match="GOEP_EP_LAYOUT_FLAT"):
            group.create_handle(nccl_ep.Layout.FLAT, ref.experts(s, me))
        with pytest.raises(nccl_ep.NcclInvalid, match="alignment"):
            group.create_handle(nccl_ep.Layout.EXPERT_MAJOR, ref.experts(s, me),
                                config=nccl_ep.HandleConfig(dispatch_output_per_expert_alignment=2 * a))
        handle.destroy()
    # Each create_handle refused above stood for a dispatch: deliver them (the group is gone: nothing to do).


@pytest.mark.parametrize("kind", [nccl_ep.ExpertIdKind.LOCAL, nccl_ep.ExpertIdKind.GLOBAL], ids=["local", "global"])
def test_ll_rank_major(comm, kind):
    """LL RANK_MAJOR: rank r's tokens with an expert here at [r, 0:src_rank_counters[r]], in token order, with their
    top-k ids (local or global, -1 elsewhere) and weights (0 elsewhere); the experts apply the weights and the
    combine sums to the reference."""
    s = shape(comm, hidden=40)
    me, R = comm.Get_rank(), comm.Get_size()
    T, H, K, L = s.tokens_of(me), s.hidden, s.topk, s.local_experts
    maxT = s.max_tokens
    with group_for(comm, s, LL) as group:
        handle = group.create_handle(nccl_ep.Layout.RANK_MAJOR, ref.experts(s, me))
        recv = np.zeros((R, maxT, H), dtype=np.uint16)
        recv_w = np.zeros((R, maxT, K), dtype=np.float32)
        recv_idx = np.zeros((R, maxT, K), dtype=np.int64)
        src_counts, total = np.zeros(R, np.int32), np.zeros(1, np.int32)
        w = ref.weights(T, K)
        handle.dispatch(nccl_ep.DispatchInputs(tokens=ref.to_bf16(ref.values(me, T, H)), topk_weights=w),
                        nccl_ep.DispatchOutputs(tokens=recv, topk_weights=recv_w, topk_idx=recv_idx),
                        layout_info=nccl_ep.LayoutInfo(src_rank_counters=src_counts, recv_total_counter=total,
                                                       recv_topk_idx_kind=kind))
        base = me * L if kind == nccl_ep.ExpertIdKind.GLOBAL else 0
        want = rm_rows(s, me)
        assert list(src_counts) == [len(r) for r in want]
        assert total[0] == sum(len(r) for r in want)
        y = np.zeros_like(recv)
        for r, rows in enumerate(want):
            for j, (t, ids, wt) in enumerate(rows):
                np.testing.assert_array_equal(ref.from_bf16(recv[r, j]), ref.values(r, t + 1, H)[t])
                np.testing.assert_array_equal(recv_idx[r, j], np.where(ids >= 0, ids + base, -1))
                np.testing.assert_array_equal(recv_w[r, j], wt)
                y[r, j] = ref.to_bf16(ref.from_bf16(recv[r, j]) * wt.sum())
        out = np.zeros((T, H), dtype=np.uint16)
        with pytest.raises(nccl_ep.NcclInvalid, match="RANK_MAJOR"):
            handle.combine(nccl_ep.CombineInputs(tokens=y), nccl_ep.CombineOutputs(tokens=out, topk_weights=w))
        handle.combine(nccl_ep.CombineInputs(tokens=y), nccl_ep.CombineOutputs(tokens=out))
        np.testing.assert_array_equal(ref.from_bf16(out), ref.combined(s, me))
        # Without copies: a cached dispatch leaves the rows in the group's buffer, laid out the same.
        handle.dispatch(nccl_ep.DispatchInputs(tokens=ref.to_bf16(ref.values(me, T, H))), nccl_ep.DispatchOutputs())
        rows = handle.recv_tokens()
        assert rows.shape == (R, maxT, H)
        for r, n in enumerate(src_counts):
            np.testing.assert_array_equal(rows[r, :n], recv[r, :n])
        handle.combine(nccl_ep.CombineInputs(tokens=y), nccl_ep.CombineOutputs(tokens=out))
        handle.destroy()


# --- dropping what does not fit ----------------------------------------------------------------------------------

def test_ht_overflow_drop(comm):
    """overflow_policy DROP: each rank keeps its first max_recv_tokens_per_rank rows (source by source, each in
    token order) and the dropped rows add nothing to the combine."""
    s = shape(comm, hidden=40)
    me, R = comm.Get_rank(), comm.Get_size()
    T, H, K, L = s.tokens_of(me), s.hidden, s.topk, s.local_experts
    bound = max(min(len(ref.received_ht(s, r)) for r in range(R)) - 3, 1)
    with group_for(comm, s, HT, max_recv_tokens_per_rank=bound, overflow_policy=nccl_ep.OverflowPolicy.DROP) as group:
        handle = group.create_handle(nccl_ep.Layout.FLAT, ref.experts(s, me))
        recv = np.zeros((bound, H), dtype=np.uint16)
        recv_w = np.zeros((bound, K), dtype=np.float32)
        total = np.zeros(1, dtype=np.int32)
        w = ref.weights(T, K)
        handle.dispatch(nccl_ep.DispatchInputs(tokens=ref.to_bf16(ref.values(me, T, H)), topk_weights=w),
                        nccl_ep.DispatchOutputs(tokens=recv, topk_weights=recv_w),
                        layout_info=nccl_ep.LayoutInfo(recv_total_counter=total))
        kept = ref.received_ht(s, me)[:bound]
        assert total[0] == len(kept)
        for j, (src, t, _, wt) in enumerate(kept):
            np.testing.assert_array_equal(ref.from_bf16(recv[j]), ref.values(src, t + 1, H)[t])
            np.testing.assert_array_equal(recv_w[j], wt)
        y = ref.to_bf16(ref.from_bf16(recv) * recv_w.sum(axis=1, keepdims=True))
        out = np.zeros((T, H), dtype=np.uint16)
        handle.combine(nccl_ep.CombineInputs(tokens=y), nccl_ep.CombineOutputs(tokens=out))
        want = np.zeros((T, H), dtype=np.float32)
        x = ref.values(me, T, H)
        for r in range(R):  # rank r returns token t's row, times its weights there, where it kept it
            rows = ref.received_ht(s, r)[:bound]
            for src, t, _, wt in rows:
                if src == me:
                    want[t] += x[t] * wt.sum()
        np.testing.assert_array_equal(ref.from_bf16(out), want)
        handle.destroy()
