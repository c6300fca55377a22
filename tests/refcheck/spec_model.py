"""Independent, exact model of the formats, MX, NVFP4 and the RHT (numpy only):
docs/numerics.md, "Element formats", "Rounding", "MX block scaling", "NVFP4" and
"Random Hadamard transform".

This is our own reading of the spec, written without looking at keel's C++.
refcheck.py uses it
  - to build and verify adversarial inputs (exact ties, clip ranges, ...),
  - to describe the element formats (decode / encode / grid), and
  - in --self-test, as a stand-in for keel-quant, so that every place where
    the spec and the references disagree shows up as a mismatch.

MX arithmetic is done exactly in float64 (every intermediate of the spec's
step 5 is exact there); NVFP4 arithmetic follows the spec's fp32 order step by
step with numpy float32 scalars/arrays.
"""

import numpy as np

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)


class ElemFormat:
    """One element format (docs/numerics.md, "Element formats")."""

    def __init__(self, name, ebits, mbits, bias, emax, max_normal, ms_name):
        self.name = name
        self.ebits = ebits
        self.mbits = mbits
        self.bias = bias
        self.emax = emax
        self.max_normal = max_normal
        self.ms_name = ms_name  # microxcaling ElemFormat name
        self.bits = 1 + ebits + mbits
        self.min_normal = 2.0 ** (1 - bias)
        self.min_subnormal = 2.0 ** (1 - bias - mbits)
        # All finite non-negative values, ascending, and the code of each.
        vals = {}
        for code in range(1 << (self.bits - 1)):
            v = self.decode_scalar(code)
            if np.isfinite(v):
                vals[v] = code
        self.grid = np.array(sorted(vals), dtype=np.float64)
        self.grid_codes = np.array([vals[v] for v in self.grid], dtype=np.int64)
        assert self.grid[-1] == max_normal, (name, self.grid[-1])

    def decode_scalar(self, code):
        e_field = (code >> self.mbits) & ((1 << self.ebits) - 1)
        m_field = code & ((1 << self.mbits) - 1)
        sign = -1.0 if (code >> (self.bits - 1)) & 1 else 1.0
        if self.name == "e4m3" and e_field == 15 and m_field == 7:
            return float("nan")
        if self.name == "e5m2" and e_field == 31:
            return sign * float("inf") if m_field == 0 else float("nan")
        if e_field == 0:
            mag = m_field * 2.0 ** (1 - self.bias - self.mbits)
        else:
            mag = (1.0 + m_field / 2.0 ** self.mbits) * 2.0 ** (e_field - self.bias)
        return sign * mag

    def decode(self, codes):
        table = np.array([self.decode_scalar(c) for c in range(1 << self.bits)])
        return table[np.asarray(codes, dtype=np.int64) & ((1 << self.bits) - 1)]

    def encode(self, r):
        """Codes of exact grid values r (float64 array; +-0 keep their sign).
        Values that are not on the grid, NaN or Inf raise."""
        r = np.asarray(r, dtype=np.float64)
        mag = np.abs(r)
        idx = np.searchsorted(self.grid, mag)
        idx = np.minimum(idx, len(self.grid) - 1)
        ok = self.grid[idx] == mag
        if not np.all(ok):
            bad = r[~ok].ravel()[:5]
            raise ValueError("encode(%s): values not on the grid: %r" % (self.name, bad))
        sign = np.signbit(r).astype(np.int64) << (self.bits - 1)
        return (self.grid_codes[idx] | sign).astype(np.uint8)

    def midpoints(self, include_clip=True):
        """Midpoints between neighbouring non-negative grid values (0 and the
        smallest subnormal included) and, if include_clip, the midpoint between
        max_normal and the next value the exponent range would have."""
        g = self.grid
        mids = list((g[1:] + g[:-1]) / 2)
        if include_clip:
            top_quantum = 2.0 ** (self.emax - self.mbits)
            mids.append(self.max_normal + top_quantum / 2)
        return np.array(mids)


FORMATS = {
    "e4m3": ElemFormat("e4m3", 4, 3, 7, 8, 448.0, "fp8_e4m3"),
    "e5m2": ElemFormat("e5m2", 5, 2, 15, 15, 57344.0, "fp8_e5m2"),
    "e3m2": ElemFormat("e3m2", 3, 2, 3, 4, 28.0, "fp6_e3m2"),
    "e2m3": ElemFormat("e2m3", 2, 3, 1, 2, 7.5, "fp6_e2m3"),
    "e2m1": ElemFormat("e2m1", 2, 1, 1, 2, 6.0, "fp4_e2m1"),
}

# keel --format name -> element format
MX_FORMATS = {
    "mxfp8_e4m3": "e4m3",
    "mxfp8_e5m2": "e5m2",
    "mxfp6_e3m2": "e3m2",
    "mxfp6_e2m3": "e2m3",
    "mxfp4": "e2m1",
}


def floor_log2_exact(a):
    """floor(log2(a)) for finite a > 0 (float64 array), exactly (frexp)."""
    _, ex = np.frexp(np.asarray(a, dtype=np.float64))
    return ex.astype(np.int64) - 1


def round_elem_exact(w, fmt, rounding, u=None):
    """Step 5 of docs/numerics.md, "MX block scaling", for the element, scale already divided out.
    w: float64 array (exact). Returns float64 grid values, saturated, sign of
    zero following w. rounding: nearest_even | nearest_away | floor (toward 0)
    | up (away from 0, used for stochastic-rounding candidate checks)."""
    w = np.asarray(w, dtype=np.float64)
    aw = np.abs(w)
    with np.errstate(divide="ignore"):
        p = np.where(aw > 0, floor_log2_exact(np.where(aw > 0, aw, 1.0)), 1 - fmt.bias)
    p = np.maximum(p, 1 - fmt.bias)
    quantum = np.ldexp(1.0, (p - fmt.mbits).astype(np.int64))
    n = aw / quantum  # exact
    if rounding == "nearest_even":
        k = np.rint(n)  # ties to even, exact in float64
    elif rounding == "nearest_away":
        k = np.floor(n + 0.5)  # n < 2^30, n + 0.5 exact
    elif rounding == "floor":
        k = np.floor(n)
    elif rounding == "up":
        k = np.ceil(n)
    elif rounding == "stochastic":
        # round away from zero with probability equal to the fraction
        k = np.floor(n) + (np.asarray(u, dtype=np.float64) < (n - np.floor(n)))
    else:
        raise ValueError(rounding)
    r = np.minimum(k * quantum, fmt.max_normal)
    r = np.where(np.isnan(w), np.nan, r)
    return np.copysign(r, w)


def _blocks_view(x, block, axis):
    """(nb_outer, nblocks, block) padded float64 view of x along axis, and a
    function that maps a padded (outer, nblocks, block) array back to x's
    shape."""
    rows, cols = x.shape
    a = x if axis == 1 else x.T
    r, c = a.shape
    nb = -(-c // block)
    pad = np.zeros((r, nb * block), dtype=a.dtype)
    pad[:, :c] = a
    blocks = pad.reshape(r, nb, block)

    def back(b):
        b = b.reshape(r, nb * block)[:, :c]
        return b if axis == 1 else b.T

    return blocks, back


def mx_scale_layout(scales_rb, axis):
    """Our (outer, nblocks) per-block array -> keel's scale layout."""
    return scales_rb if axis == 1 else scales_rb.T


def mx_quantize(x, elem, block, axis, rounding, seed=0):
    """docs/numerics.md, "MX block scaling". x: float32 (rows, cols). Returns
    (out float32, codes uint8 (rows, cols), scales uint8 in keel's layout,
    nan_mask bool (rows, cols): elements of NaN blocks)."""
    fmt = FORMATS[elem]
    x = np.asarray(x, dtype=np.float32)
    blocks, back = _blocks_view(x.astype(np.float64), block, axis)
    bad = ~np.isfinite(blocks)
    block_bad = bad.any(axis=-1)
    amax = np.where(bad, 0.0, np.abs(blocks)).max(axis=-1)
    amax = np.where(amax == 0, 2.0 ** -126, amax)
    e = floor_log2_exact(amax) - fmt.emax
    block_nan = block_bad | (e > 127)
    e = np.maximum(e, -127)
    e = np.where(block_nan, 0, e)
    w = np.where(bad, 0.0, blocks) * np.ldexp(1.0, -e)[..., None]  # exact in float64
    u = np.random.default_rng(seed).random(w.shape) if rounding == "stochastic" else None
    r = round_elem_exact(w, fmt, rounding, u)
    out = r * np.ldexp(1.0, e)[..., None]
    out = np.where(block_nan[..., None], np.nan, out)
    codes = fmt.encode(np.where(block_nan[..., None], 0.0, r))
    scales = np.where(block_nan, 0xFF, e + 127).astype(np.uint8)
    nan_mask = np.broadcast_to(block_nan[..., None], blocks.shape)
    return (back(out).astype(np.float32), back(codes).astype(np.uint8),
            np.ascontiguousarray(mx_scale_layout(scales, axis)), back(nan_mask).astype(bool))


# ----------------------------------------------------------------------------
# NVFP4 (docs/numerics.md, "NVFP4")
# ----------------------------------------------------------------------------
RHT_SIGNS = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], dtype=np.float64)


def hadamard16():
    h = np.ones((1, 1))
    while h.shape[0] < 16:
        h = np.block([[h, h], [h, -h]])
    return h


def rht_matrix_f32():
    """(diag(s) H16) / 4 as float32 (entries +-0.25, exact)."""
    return (RHT_SIGNS[:, None] * hadamard16() / 4.0).astype(np.float32)


def rht_index_order(x, axis):
    """y = x * (diag(s) H16)/4 per 16-chunk along axis; y_j accumulated in
    fp32 in index order i = 0..15 of the pre-scaled products x_i * M[i][j]
    (each product is exact unless it is an fp32 subnormal)."""
    a = np.asarray(x, dtype=np.float32)
    a = a if axis == 1 else a.T
    r, c = a.shape
    assert c % 16 == 0
    m = rht_matrix_f32()
    chunks = a.reshape(r, c // 16, 16)
    y = np.zeros_like(chunks)
    with np.errstate(over="ignore", invalid="ignore"):
        for i in range(16):
            y = (y + (chunks[..., i:i + 1] * m[i][None, None, :]).astype(np.float32)).astype(np.float32)
    y = y.reshape(r, c)
    return np.ascontiguousarray(y if axis == 1 else y.T)


def e4m3_rne(d):
    """RNE of float32 d (|d| <= 448 or NaN) onto E4M3; returns (float32 value,
    uint8 code)."""
    d = np.asarray(d, dtype=np.float32)
    fmt = FORMATS["e4m3"]
    nan = np.isnan(d)
    r = round_elem_exact(np.where(nan, 0.0, d.astype(np.float64)), fmt, "nearest_even")
    codes = fmt.encode(r)
    codes = np.where(nan, np.uint8(0x7F), codes).astype(np.uint8)
    val = np.where(nan, np.nan, r).astype(np.float32)
    return val, codes


def nvfp4_quantize(x, tile16x16=False, rht=False, axis=1, rounding="nearest_even", seed=0,
                   scale_order="spec"):
    """docs/numerics.md, "NVFP4", in its fp32 order. scale_order "legacy_te"
    computes the block scale as TE's reference did before v2.15
    (d = (amax_b / 6) * S_enc) instead of the spec's amax_b * (S_enc * (1/6)).
    Returns (out float32,
    codes uint8 (rows, cols), scales uint8 in keel's layout, s_dec float32,
    t float32 = clamp(x * s_b) before the E2M1 rounding)."""
    x = np.asarray(x, dtype=np.float32)
    if rht:
        x = rht_index_order(x, axis)
    a = x if axis == 1 else x.T
    r, c = a.shape
    assert c % 16 == 0
    nb = c // 16
    with np.errstate(all="ignore"):
        amax_t = F32(np.max(np.abs(a)))  # NaN propagates (as torch.max does)
        s_enc = F32(F32(448.0 * 6.0) / amax_t)
        if np.isinf(s_enc):
            s_enc = FLT_MAX
        if s_enc == 0:
            s_enc = F32(1.0)
        s_dec = F32(F32(1.0) / s_enc)
        blocks = a.reshape(r, nb, 16)
        amax_b = np.max(np.abs(blocks), axis=-1)
        if tile16x16:
            # rows the tile does not divide: zero rows pad the last tile
            rp = -(-r // 16) * 16
            padded = np.zeros((rp, nb), np.float32)
            padded[:r] = amax_b
            t = padded.reshape(rp // 16, 16, nb).max(axis=1)
            amax_b = np.repeat(t, 16, axis=0)[:r]
        if scale_order == "legacy_te":
            d = np.minimum(((amax_b / F32(6.0)).astype(np.float32) * s_enc).astype(np.float32), FLT_MAX)
        else:
            m = F32(s_enc * F32(F32(1.0) / F32(6.0)))
            d = np.minimum((amax_b * m).astype(np.float32), FLT_MAX)
        d = np.clip(d, F32(-448.0), F32(448.0))
        sf, sf_codes = e4m3_rne(d)
        s_b = np.minimum((F32(1.0) / (sf * s_dec).astype(np.float32)).astype(np.float32), FLT_MAX)
        tt = np.clip((blocks * s_b[..., None]).astype(np.float32), F32(-6.0), F32(6.0))
    fmt = FORMATS["e2m1"]
    nan = np.isnan(tt)
    u = np.random.default_rng(seed).random(tt.shape) if rounding == "stochastic" else None
    q = round_elem_exact(np.where(nan, 0.0, tt.astype(np.float64)), fmt, rounding, u)
    codes = fmt.encode(q)
    q = np.where(nan, np.nan, q).astype(np.float32)
    with np.errstate(all="ignore"):
        out = ((q * sf[..., None]).astype(np.float32) * s_dec).astype(np.float32)

    def back(b):
        b = b.reshape(r, c)
        return np.ascontiguousarray(b if axis == 1 else b.T)

    scales = np.ascontiguousarray(sf_codes if axis == 1 else sf_codes.T)
    return back(out), back(codes), scales, F32(s_dec), back(tt)


# ----------------------------------------------------------------------------
# Packing (kernels/quantize.h PackCodes, kernels/quantizer.h packed file)
# ----------------------------------------------------------------------------
def pack_codes(codes, elem):
    codes = np.asarray(codes, dtype=np.uint8).ravel()
    bits = FORMATS[elem].bits
    if bits == 4:
        if codes.size % 2:
            codes = np.concatenate([codes, np.zeros(1, np.uint8)])
        return ((codes[0::2] & 0xF) | ((codes[1::2] & 0xF) << 4)).astype(np.uint8)
    return (codes & ((1 << bits) - 1)).astype(np.uint8)


def unpack_codes(data, count, elem):
    data = np.frombuffer(bytes(data), dtype=np.uint8)
    bits = FORMATS[elem].bits
    if bits == 4:
        out = np.empty(data.size * 2, np.uint8)
        out[0::2] = data & 0xF
        out[1::2] = data >> 4
        return out[:count]
    return data[:count].copy()


def packed_code_bytes(count, elem):
    return (count + 1) // 2 if FORMATS[elem].bits == 4 else count
