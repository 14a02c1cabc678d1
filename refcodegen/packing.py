"""Compile-time weight packing: folded constants rearranged into the layouts the C core reads."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def conv2d_weight_oihw(weight: np.ndarray, kernel_layout: str, groups: int, in_c: int) -> np.ndarray:
    """Weights as ``[out_c][in_c/groups][KH][KW]`` from any O/I/H/W ``kernel_layout``.

    nn.conv2d's type relation (TVM 0.19 Conv2DRel) reads a kernel whose O axis equals
    ``groups == in_c`` as depthwise ``[in_c][multiplier][KH][KW]`` (TFLite's HWOI), output
    channel ``c * multiplier + m``: the same order as ``[in_c * multiplier][1]``.
    """
    oihw = weight.transpose([kernel_layout.index(axis) for axis in "OIHW"])
    if groups > 1 and oihw.shape[0] == groups == in_c:
        oihw = oihw.reshape(-1, 1, *oihw.shape[2:])
    return oihw


def pack_conv2d_weight(weight: np.ndarray, kernel_layout: str, groups: int, in_c: int) -> np.ndarray:
    """Weights as ``[O][KH][KW][I/groups]``, contiguous: one output channel's taps in a row."""
    return np.ascontiguousarray(conv2d_weight_oihw(weight, kernel_layout, groups, in_c).transpose(0, 2, 3, 1))


# ---- accelerated kernels (runtime/include/refcg.h) ----------------------------------------
# The SIMD kernels read the input shifted into the domain their instructions multiply:
# uint8 on x86 (vpdpbusd, vpmaddubsw, vpmaddwd), int8 on aarch64 (sdot, smull). Shift s per domain and
# input dtype; the correction corr = bias - (s + izp) * sum(w') makes the shifted sum exact.
_DOMAIN_SHIFT = {("u8", "int8"): 128, ("u8", "uint8"): 0, ("s8", "int8"): 0, ("s8", "uint8"): -128}
_DTYPE_RANGE = {"int8": (-128, 127), "uint8": (0, 255)}


@dataclass(frozen=True)
class GemmWeights:
    """``refcg_gemm_weights``: w' blocked [np/16][kp/4][16][4] int8, both corrections, and per
    16-channel block whether AVX2's vpmaddubsw computes it exactly (``pairs_fit_int16``)."""

    kp: int
    np: int
    w: np.ndarray
    corr_u8: np.ndarray
    corr_s8: np.ndarray
    pair_safe: np.ndarray  # uint8 [np/16]


@dataclass(frozen=True)
class ConvFast:
    """``refcg_conv2d_fast``: what the accelerated conv kernels read besides the reference data."""

    kind: str  # REFCG_FAST_GEMM or REFCG_FAST_DEPTHWISE
    cp: int
    gemm: GemmWeights | None = None
    dw_w: np.ndarray | None = None
    dw_corr_u8: np.ndarray | None = None
    dw_corr_s8: np.ndarray | None = None
    dw_pairs: np.ndarray | None = None  # int16, refcg_dw_pair_weights' layout
    dw_quads: np.ndarray | None = None  # int8, refcg_dw_quad_weights' layout (square 3x3 and 5x5 only)
    winograd: bool = False  # the library gives the conv a refcg_wino_cache (winograd_ok)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _wrap_int32(values: np.ndarray) -> np.ndarray:
    """Two's-complement wrap, as the int32 accumulators of TVM and the kernels wrap."""
    return (np.asarray(values, dtype=np.int64) & 0xFFFFFFFF).astype(np.uint32).view(np.int32)


def _folded(weight: np.ndarray, kernel_zp: int) -> np.ndarray | None:
    """w' = w - kernel_zp as int8, or None when it does not fit (then only the reference runs)."""
    folded = weight.astype(np.int64) - int(kernel_zp)
    if folded.size == 0 or folded.min() < -128 or folded.max() > 127:
        return None
    return folded.astype(np.int8)


def _corrections(wsum: np.ndarray, bias: np.ndarray | None, input_zp: int, in_dtype: str) -> tuple:
    base = np.zeros_like(wsum) if bias is None else np.asarray(bias, dtype=np.int64).reshape(-1)
    return tuple(_wrap_int32(base - (_DOMAIN_SHIFT[(domain, in_dtype)] + input_zp) * wsum) for domain in ("u8", "s8"))


def _fast_inputs_ok(input_zp: int, in_dtype: str) -> bool:
    lo, hi = _DTYPE_RANGE.get(in_dtype, (1, 0))
    return lo <= int(input_zp) <= hi  # padding is stored as one byte in the domain


def pairs_fit_int16(blocked: np.ndarray) -> np.ndarray:
    """Per block of ``blocked`` [nblocks][kp/4][16][4]: 1 when no vpmaddubsw of it can saturate.

    vpmaddubsw sums the products of k = (0, 1) and (2, 3) of each 4-byte group in int16, saturating.
    Its u8 operand is the domain byte: x ^ 0x80 for int8 inputs, x for uint8, and padding izp (+ 128),
    any value in [0, 255] for both dtypes (the zero point does not narrow it). A pair's sum is extreme at
    x = 255 on the weights of one sign and 0 on the others, so it fits int16 for every input iff
    255 * (max(w0, 0) + max(w1, 0)) <= 32767 and 255 * (min(w0, 0) + min(w1, 0)) >= -32768, i.e.
    positive part <= 128 and negative part >= -128. Zero padding of k and of channels always passes.
    """
    pairs = blocked.astype(np.int32).reshape(blocked.shape[0], -1, 2)
    pos, neg = np.clip(pairs, 0, None).sum(axis=2), np.clip(pairs, None, 0).sum(axis=2)
    return ((255 * pos <= 32767) & (255 * neg >= -32768)).all(axis=1).astype(np.uint8)


def _block_gemm(folded_nk: np.ndarray, bias, input_zp: int, in_dtype: str) -> GemmWeights:
    """Block w'[n][k] (k already laid out as the kernels walk it, a multiple of 4)."""
    n, k = folded_nk.shape
    np_, kp = _round_up(n, 16), _round_up(k, 4)
    padded = np.zeros((np_, kp), np.int8)
    padded[:n, :k] = folded_nk
    blocked = padded.reshape(np_ // 16, 16, kp // 4, 4).transpose(0, 2, 1, 3)
    wsum = folded_nk.astype(np.int64).sum(axis=1)
    corr_u8, corr_s8 = _corrections(wsum, bias, input_zp, in_dtype)
    pad = np.zeros(np_ - n, np.int32)
    return GemmWeights(kp, np_, np.ascontiguousarray(blocked).reshape(-1),
                       np.concatenate([corr_u8, pad]), np.concatenate([corr_s8, pad]), pairs_fit_int16(blocked))


def dw_pair_weights(taps_cp: np.ndarray) -> np.ndarray:
    """Depthwise w' [taps][cp] (cp a multiple of 16) as tap pairs for vpmaddwd, the layout of
    refcg_dw_pair_weights (runtime/refcg_fast_internal.h): per pair of taps (an odd last one paired with
    zeros) and block of 16 channels l = 8 * lane + 4 * half + q, the 32 int16 [half][lane][q][tap]."""
    taps, cp = taps_cp.shape
    even = np.zeros((taps + taps % 2, cp), np.int16)
    even[:taps] = taps_cp
    by_lane = even.reshape(-1, 2, cp // 16, 2, 2, 4)  # [pair][tap][block][lane][half][q]
    return np.ascontiguousarray(by_lane.transpose(0, 2, 4, 3, 5, 1)).reshape(-1)


def dw_quad_weights(taps_cp: np.ndarray, kh: int, kw: int) -> np.ndarray:
    """Depthwise w' [kh * kw][cp] as row quads for vpdpbusd, the layout of refcg_dw_quad_weights: per
    group g of 4 kernel rows (zeros past kh), column and channel, the 4 rows' int8 [g][kw][cp][row]."""
    cp = taps_cp.shape[1]
    rows = np.zeros((_round_up(kh, 4), kw, cp), np.int8)
    rows[:kh] = taps_cp.reshape(kh, kw, cp)
    return np.ascontiguousarray(rows.reshape(-1, 4, kw, cp).transpose(0, 2, 3, 1)).reshape(-1)


def pack_gemm_weights(weight_nk: np.ndarray, kernel_zp: int, input_zp: int, in_dtype: str,
                      bias: np.ndarray | None = None) -> GemmWeights | None:
    """Dense weights [units][in_features] for ``refcg_dense``; None when w - kernel_zp leaves int8."""
    folded = _folded(np.asarray(weight_nk), kernel_zp)
    if folded is None or not _fast_inputs_ok(input_zp, in_dtype):
        return None
    return _block_gemm(folded, bias, input_zp, in_dtype)


# refcg_wino_job (runtime/refcg_fast_internal.h): 4 y = A^T (U . V) A with |V| <= 4 * 255 and |U| <= 9 * 128
# is exact in int32 while 4 * 9 * 255 * 128 * cp < 2^31
WINOGRAD_MAX_CP = 1824


def winograd_ok(params: dict, cp: int) -> bool:
    """A groups == 1 conv the C core may run as Winograd F(2x2, 3x3) exactly: 3x3, stride 1, no dilation,
    whole 16-channel vectors, and every sum of its transformed domain within int32."""
    return (params["groups"] == 1 and (params["kernel_h"], params["kernel_w"]) == (3, 3)
            and (params["stride_h"], params["stride_w"], params["dilation_h"], params["dilation_w"]) == (1, 1, 1, 1)
            and cp % 16 == 0 and cp <= WINOGRAD_MAX_CP)


def pack_conv2d_fast(ohwi: np.ndarray, params: dict, in_dtype: str, bias: np.ndarray | None) -> ConvFast | None:
    """Data for ``refcg_conv2d`` from the reference packing [O][KH][KW][I/groups] and the conv params.

    groups == 1: implicit GEMM, each tap's channels padded to a multiple of 4 (the padded input
    copy has the same channel count, so k = (kh, kw, c) walks both alike). Depthwise (groups ==
    in_c, out_c = in_c * multiplier): w' as int16 [tap][out channel rounded up to 16]; the NCHW
    plane kernels run multipliers, the NHWC path only multiplier 1. Anything else: None.
    """
    folded = _folded(ohwi, params["kernel_zp"])
    if folded is None or not _fast_inputs_ok(params["input_zp"], in_dtype):
        return None
    out_c, kh, kw, cin_g = folded.shape
    if kh * kw > 256:  # refcg_conv2d's segment table holds 256 taps (refcg_fast_usable): reference only
        return None
    groups = params["groups"]
    if groups == 1:
        cp = _round_up(cin_g, 4)
        taps = np.zeros((out_c, kh, kw, cp), np.int8)
        taps[..., :cin_g] = folded
        gemm = _block_gemm(taps.reshape(out_c, -1), bias, params["input_zp"], in_dtype)
        return ConvFast("REFCG_FAST_GEMM", cp, gemm=gemm, winograd=winograd_ok(params, cp))
    if groups == params["in_c"] and cin_g == 1:  # channel multiplier out_c / in_c
        cp = _round_up(out_c, 16)
        dw = np.zeros((kh * kw, cp), np.int16)
        dw[:, :out_c] = folded.reshape(out_c, kh * kw).T
        wsum = folded.astype(np.int64).reshape(out_c, -1).sum(axis=1)
        pad = np.zeros(cp - out_c, np.int32)  # epilogues load whole vectors of corrections
        corr_u8, corr_s8 = (np.concatenate([c, pad]) for c in _corrections(wsum, bias, params["input_zp"], in_dtype))
        channels = out_c == params["in_c"]  # multiplier 1: the layouts of the channel kernels
        return ConvFast("REFCG_FAST_DEPTHWISE", cp, dw_w=dw.reshape(-1), dw_corr_u8=corr_u8, dw_corr_s8=corr_s8,
                        dw_pairs=dw_pair_weights(dw) if channels else None,
                        dw_quads=dw_quad_weights(dw, kh, kw) if channels and kh == kw and kh in (3, 5) else None)
    return None
