"""Adversarial inputs for refcheck.py (our own code).

Every generator returns float32 matrices laid out for axis 1 (blocks along a
row); refcheck transposes them for axis 0, so that the same blocks then run
down the columns.
"""

import zlib

import numpy as np

import spec_model as sm

F32 = np.float32
FLT_MAX = float(np.finfo(np.float32).max)


def rng_for(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def f32(v):
    return np.asarray(v, dtype=np.float64).astype(np.float32)


def next_up(v):
    with np.errstate(over="ignore"):
        return np.nextafter(f32(v), F32(np.inf))


def next_down(v):
    with np.errstate(over="ignore"):
        return np.nextafter(f32(v), F32(-np.inf))


def assemble(blocks, block, blocks_per_row=4, cols=None):
    """Lays a list of 1-D blocks (len <= block, zero-padded) into rows of
    blocks_per_row blocks. With cols (< blocks_per_row * block) the last block
    of each row is cut to make a partial block (the cut part is dropped)."""
    nb = len(blocks)
    rows = -(-nb // blocks_per_row)
    a = np.zeros((rows, blocks_per_row * block), np.float32)
    for i, b in enumerate(blocks):
        r, k = divmod(i, blocks_per_row)
        b = np.asarray(b, np.float32)
        a[r, k * block:k * block + len(b)] = b
    if cols is not None:
        a = a[:, :cols]
    return a


def chunk(values, n):
    values = list(values)
    return [values[i:i + n] for i in range(0, len(values), n)]


# ----------------------------------------------------------------------------
# MX
# ----------------------------------------------------------------------------
def scale_exponents(fmt, quick):
    """Block exponents e to test: from the clamp floor to the largest e whose
    max_normal * 2^e is finite in fp32."""
    top = 127 - fmt.emax
    es = [-127, -126 + fmt.emax - 1, -120, -64, -10, -1, 0, 1, 5, 64, top - 1, top]
    if quick:
        es = [-127, -64, -1, 0, 5, top]
    return sorted(set(e for e in es if -127 <= e <= top))


def mx_ties(fmt, block, quick, neighbours=False):
    """Blocks holding every midpoint between neighbouring codes (0 .. min
    subnormal included, and max_normal .. the clip-range midpoint), both
    signs, at several block exponents e. Each block's first slot (rotated
    through the block) is +-max_normal * 2^e so the block exponent is exactly
    e. With neighbours, each midpoint is replaced by the fp32 values one ulp
    below and above it (after scaling)."""
    blocks = []
    mids = fmt.midpoints(include_clip=True)
    for e in scale_exponents(fmt, quick):
        s = 2.0 ** e
        vals = []
        for m in mids:
            v = m * s
            assert f32(v) == v, (fmt.name, m, e)
            if neighbours:
                vals += [next_down(v), next_up(v), -next_down(v), -next_up(v)]
            else:
                vals += [v, -v]
        per = block - 1
        for i, c in enumerate(chunk(vals, per)):
            anchor = fmt.max_normal * s * (1 if i % 2 == 0 else -1)
            pos = i % block
            b = list(c)
            b.insert(min(pos, len(b)), anchor)
            blocks.append(b)
    return assemble(blocks, block)


def mx_clamped_scale_ties(fmt, block):
    """Blocks whose exponent is clamped to -127 (amax < 2^(emax-127)): the
    elements are midpoints * 2^-127 below max_normal * 2^-127 / 2."""
    blocks = []
    s = 2.0 ** -127
    mids = [m for m in fmt.midpoints(include_clip=False) if m < fmt.max_normal / 2]
    vals = []
    for m in mids:
        vals += [m * s, -m * s]
    for c in chunk(vals, block):
        blocks.append(c)
    # and blocks whose true exponent is far below -127
    blocks.append([2.0 ** -149, -2.0 ** -149, 2.0 ** -140, 3 * 2.0 ** -140])
    return assemble(blocks, block)


def mx_outliers(fmt, block, quick):
    """Normal values with outliers; block scales spanning 1e-30 .. 1e30, and
    some blocks whose elements individually span 1e-30 .. 1e30."""
    rng = rng_for("outliers", fmt.name, block)
    nblocks = 24 if quick else 64
    blocks = []
    for i in range(nblocks):
        if i % 4 == 3:
            mag = 10.0 ** rng.uniform(-30, 30, size=block)
            b = mag * rng.choice([-1.0, 1.0], size=block)
        else:
            base = 10.0 ** rng.uniform(-30, 30)
            b = rng.standard_normal(block) * base
            k = rng.integers(1, 3)
            idx = rng.choice(block, size=k, replace=False)
            b[idx] *= 10.0 ** rng.uniform(0, 8, size=k)
        blocks.append(np.clip(b, -3e38, 3e38))
    return assemble(blocks, block)


def mx_zeros(fmt, block):
    """All-zero blocks (+0, -0, mixed) and blocks of zeros with one tiny value."""
    z = np.zeros(block)
    nz = -np.zeros(block)
    mixed = np.where(np.arange(block) % 2 == 0, 0.0, -0.0)
    one_tiny = nz.copy()
    one_tiny[block // 2] = 2.0 ** -149
    one_neg = z.copy()
    one_neg[-1] = -1.0
    one_big = nz.copy()
    one_big[0] = 3.0e38
    return assemble([z, nz, mixed, one_tiny, one_neg, one_big], block, blocks_per_row=3)


def mx_nan_inf(fmt, block):
    """Blocks with NaN / +-Inf at various positions, next to ordinary blocks
    (which must not be affected), and NaN + Inf together."""
    rng = rng_for("naninf", fmt.name, block)
    blocks = []
    for special in [np.nan, np.inf, -np.inf]:
        for pos in [0, block // 2, block - 1]:
            b = rng.standard_normal(block)
            b[pos] = special
            blocks.append(b)
            blocks.append(rng.standard_normal(block) * 100)
    b = np.zeros(block)
    b[1] = np.inf
    b[2] = np.nan
    blocks.append(b)
    b = -np.zeros(block)
    b[0] = np.nan
    blocks.append(b)
    b = np.full(block, FLT_MAX)
    b[3] = -np.inf
    blocks.append(b)
    return assemble(blocks, block, blocks_per_row=3)


def mx_subnormals(fmt, block):
    """fp32 subnormals: all-subnormal blocks (random bit patterns), blocks
    with a normal maximum and subnormal rest, the smallest normals."""
    rng = rng_for("subnormal", fmt.name, block)
    blocks = []
    for i in range(6):
        bits = rng.integers(1, 1 << 23, size=block, dtype=np.uint32)
        if i % 2:
            bits |= np.uint32(0x80000000)
        blocks.append(bits.view(np.float32))
    for top in [2.0 ** -126, 2.0 ** -120, 2.0 ** -100, 1.5 * 2.0 ** -118]:
        bits = rng.integers(1, 1 << 23, size=block, dtype=np.uint32)
        b = bits.view(np.float32).astype(np.float64) * rng.choice([-1.0, 1.0], size=block)
        b[rng.integers(block)] = top
        blocks.append(b)
    blocks.append(np.full(block, 2.0 ** -149))
    blocks.append(np.full(block, -(2.0 ** -126) * (1 - 2.0 ** -23)))
    return assemble(blocks, block, blocks_per_row=3)


def mx_pow2_edge(fmt, block, quick):
    """Block maxima just below, at and just above powers of two:
    2^k (1 - j 2^-24) for j = 1..48, 2^k, 2^k (1 + 2^-23), over k spanning
    the fp32 range (FLT_MAX = 2^128 (1 - 2^-24) included). Here fp32
    torch.log2 rounds up to k for |k| >= 3 and small j. Other elements:
    random, up to the maximum."""
    rng = rng_for("pow2", fmt.name, block)
    ks = [-125, -120, -100, -64, -30, -20, -8, -4, -3, -2, -1, 0, 1, 2, 3, 4, 8, 9, 16, 20, 30, 64,
          100, 120, 126, 127, 128]
    js = [1, 2, 3, 5, 8, 11, 12, 16, 22, 23, 24, 32, 44, 45, 46, 48]
    if quick:
        ks = [-100, -20, -3, 0, 3, 4, 20, 100, 128]
        js = [1, 2, 11, 12, 44, 45]
    blocks = []
    for k in ks:
        maxima = [2.0 ** k * (1 - j * 2.0 ** -24) for j in js]
        if k < 128:
            maxima += [2.0 ** k, 2.0 ** k * (1 + 2.0 ** -23)]
        for i, mx in enumerate(maxima):
            mx = float(f32(mx))
            b = rng.uniform(-1, 1, size=block) * mx * rng.choice([1.0, 0.5, 2.0 ** -10])
            b[i % block] = mx if i % 3 else -mx
            blocks.append(np.clip(b, -FLT_MAX, FLT_MAX))
    return assemble(blocks, block)


def mx_clip_range(fmt, block, quick):
    """Block maxima in [max_normal, 2^(emax+1)) * 2^e: max_normal, one ulp
    above, the clip-range midpoint and its neighbours, points spread through
    the range, 2^(emax+1)(1 - 2^-10) and 2^(emax+1)(1 - 2^-24)."""
    rng = rng_for("clip", fmt.name, block)
    top = 2.0 ** (fmt.emax + 1)
    mid = fmt.midpoints(include_clip=True)[-1]
    rel = [fmt.max_normal, mid] + list(np.linspace(fmt.max_normal, top, 9)[1:-1]) + [
        top * (1 - 2.0 ** -10), top * (1 - 2.0 ** -24)]
    blocks = []
    for e in scale_exponents(fmt, quick):
        s = 2.0 ** e
        for i, r in enumerate(rel):
            mx = float(f32(r * s))
            for v in ([mx, next_up(mx), next_down(mx)] if r == mid else [mx, next_up(mx)]):
                v = float(v)
                if v >= top * s or not np.isfinite(v):
                    continue
                b = rng.uniform(-1, 1, size=block) * fmt.max_normal * s
                b[(i * 7) % block] = v if i % 2 else -v
                blocks.append(b)
    return assemble(blocks, block)


def mx_neg_underflow(fmt, block):
    """Huge block maxima with tiny negative elements: the scaled quotient
    v / 2^e underflows fp32 (to -0 or a subnormal); and negatives rounding to
    zero. Tests the sign of zero results."""
    blocks = []
    for big in [3.0e38, 1e30, 2.0 ** 100, 1e10]:
        b = np.zeros(block)
        b[0] = big
        tiny = [-1e-30, -2.0 ** -149, -1e-45, -1e-38, -3e-39, -2.0 ** -126, -1e-20, -1e-10, -1.0,
                -0.0, 1e-30, 2.0 ** -149]
        b[1:1 + len(tiny)] = tiny[:block - 1]
        blocks.append(b)
    return assemble(blocks, block, blocks_per_row=2)


def mx_half_min_subnormal(fmt, block, quick):
    """Elements a hair below half the smallest element subnormal:
    |w| = min_sub * (0.5 - 2^-25) (microxcaling's floor(x + 0.5) rounds this
    up in fp32), the tie min_sub / 2 itself and min_sub * (0.5 + 2^-24), at
    several block exponents."""
    blocks = []
    for e in scale_exponents(fmt, quick):
        s = 2.0 ** e
        ms = fmt.min_subnormal
        vals = [ms * (0.5 - 2.0 ** -25), ms * 0.5, ms * (0.5 + 2.0 ** -24), ms * (0.5 - 2.0 ** -24),
                ms * (0.25), ms * (0.75 - 2.0 ** -24), ms * 0.75, ms * (1.5 - 2.0 ** -23)]
        b = []
        for v in vals:
            v = v * s
            if v >= 2.0 ** -149 and f32(v) == v:
                b += [v, -v]
        for c in chunk(b, block - 1):
            blocks.append([fmt.max_normal * s] + c)
    return assemble(blocks, block, blocks_per_row=2)


def mx_random_bits(fmt, block, quick):
    """Random finite fp32 bit patterns over every exponent."""
    rng = rng_for("bits", fmt.name, block)
    n = (16 if quick else 48) * block
    bits = rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = np.where(np.isfinite(x), x, F32(1.0))
    return x.reshape(-1, 4 * block)


def mx_partial(fmt, block):
    """Shapes that are not a multiple of the block: cols = k*block + r, a
    matrix narrower than one block, a 1x1 matrix, and NaN / a block maximum
    in the trailing partial block."""
    rng = rng_for("partial", fmt.name, block)
    out = []
    for rows, cols in [(3, block + 5), (5, 2 * block + block // 2 + 1), (2, 7), (1, 1), (4, block - 1)]:
        a = (rng.standard_normal((rows, cols)) * 10.0 ** rng.uniform(-5, 5, size=(rows, 1))).astype(np.float32)
        if cols > block:
            a[0, -1] = 1e6            # the block maximum sits in the partial block
            if rows > 2:
                a[2, -2] = np.nan     # NaN in a partial block
        out.append(("partial_%dx%d" % (rows, cols), a))
    return out


def mx_cases(fmt_name, block, quick):
    """[(case name, matrix for axis 1)] for one element format and block."""
    fmt = sm.FORMATS[fmt_name]
    cases = [
        ("ties", mx_ties(fmt, block, quick)),
        ("tie_neighbours", mx_ties(fmt, block, quick, neighbours=True)),
        ("clamped_scale", mx_clamped_scale_ties(fmt, block)),
        ("outliers", mx_outliers(fmt, block, quick)),
        ("zeros", mx_zeros(fmt, block)),
        ("nan_inf", mx_nan_inf(fmt, block)),
        ("subnormals", mx_subnormals(fmt, block)),
        ("pow2_edge", mx_pow2_edge(fmt, block, quick)),
        ("clip_range", mx_clip_range(fmt, block, quick)),
        ("neg_underflow", mx_neg_underflow(fmt, block)),
        ("half_min_sub", mx_half_min_subnormal(fmt, block, quick)),
        ("random_bits", mx_random_bits(fmt, block, quick)),
    ]
    cases += mx_partial(fmt, block)
    return [(n, np.ascontiguousarray(a, dtype=np.float32)) for n, a in cases]


def mx_sr_input(fmt_name, block):
    """Values with random fractions between grid points (stochastic rounding)."""
    rng = rng_for("sr", fmt_name, block)
    rows = 64
    a = rng.standard_normal((rows, 8 * block)) * 10.0 ** rng.uniform(-3, 3, size=(rows, 1))
    return a.astype(np.float32)


# ----------------------------------------------------------------------------
# NVFP4
# ----------------------------------------------------------------------------
E2M1_MIDS = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]


def nvfp4_ties_rotated(k_list, j_list, neighbours, rows_per_tile, offset=None):
    """Returns y (the tensor the quantizer sees after the optional RHT) of
    shape (R, C) with C a multiple of 16. S_enc = 2^k exactly (global amax
    2688 * 2^-k sits alone in its own 16-chunk); each tie block has amax
    6 * 2^(j-k), so its E4M3 scale is exactly 2^j and x * s_b = x * 2^(k-j)
    is exact; its other elements are E2M1 midpoints (or their fp32
    neighbours) times 2^(j-k). With rows_per_tile 16 (16x16 tiles) the
    anchor 6 * 2^(j-k) sits in the first row of each 16-row tile and the
    other rows hold midpoints."""
    tensors = []
    for k in k_list:
        blocks_rows = []
        for j in j_list:
            s = 2.0 ** (j - k)
            vals = []
            for m in E2M1_MIDS:
                v = m * s
                if neighbours and offset:
                    d = offset * s
                    vals += [v - d, v + d, -(v - d), -(v + d)]
                elif neighbours:
                    vals += [float(next_down(v)), float(next_up(v)), -float(next_down(v)), -float(next_up(v))]
                else:
                    vals += [v, -v]
            # tile of rows_per_tile rows x 16: anchor in row 0 col (j % 16)
            per_tile = rows_per_tile * 16 - 1
            for c in chunk(vals, per_tile):
                tile = np.zeros(rows_per_tile * 16)
                flat = list(c)
                pos = (j * 5) % (rows_per_tile * 16)
                flat.insert(min(pos, len(flat)), 6.0 * s if j % 2 else -6.0 * s)
                tile[:len(flat)] = flat
                blocks_rows.append(tile.reshape(rows_per_tile, 16))
        anchor = np.zeros((rows_per_tile, 16))
        anchor[0, 3] = -2688.0 * 2.0 ** -k
        blocks_rows.append(anchor)
        tensors.append(blocks_rows)
    return tensors


def nvfp4_tie_tensors(tile16x16, neighbours, quick, offset=None):
    """[(name, y)] tie tensors: one per k so that each has its own global amax.
    neighbours: the fp32 neighbours of each midpoint, or with offset, the
    midpoint +- offset (in units of the E2M1 value; dyadic, so that the
    inverse RHT stays exact)."""
    rpt = 16 if tile16x16 else 1
    k_list = [0, 7, -20] if quick else [0, 7, -20, 40, -60, 100]
    j_list = [-9, -7, -6, -3, 0, 1, 5, 8] if not quick else [-9, -6, 0, 8]
    out = []
    for k, tiles in zip(k_list, nvfp4_ties_rotated(k_list, j_list, neighbours, rpt, offset)):
        # arrange tiles (rpt x 16) into rows of 4 tiles
        per_row = 4
        n = len(tiles)
        nrow = -(-n // per_row)
        a = np.zeros((nrow * rpt, per_row * 16))
        for i, t in enumerate(tiles):
            r, c = divmod(i, per_row)
            a[r * rpt:(r + 1) * rpt, c * 16:(c + 1) * 16] = t
        if not tile16x16 and a.shape[0] % 2 == 0:
            a = np.vstack([a, np.zeros((1, a.shape[1]))])  # odd row count: rows need not divide 16
        assert np.all(f32(a) == a)
        out.append(("%s_k%d" % ("tie_neighbours" if neighbours else "ties", k), a.astype(np.float32)))
    return out


def nvfp4_scale_ties(amax_t, tile16x16, quick):
    """Blocks whose E4M3 block scale d = amax_b * (S_enc * (1/6)) lands on or
    next to a midpoint between neighbouring E4M3 values: amax_b = the fp32
    values nearest mu / m and their neighbours (+-2 ulp), for every E4M3
    midpoint mu. Catches a different order of the scale arithmetic (e.g. TE
    before v2.15: (amax_b / 6) * S_enc) and the E4M3 tie rule. The global
    amax amax_t sits alone in the first block."""
    s_enc = F32(F32(2688.0) / F32(amax_t))
    m = F32(s_enc * F32(F32(1.0) / F32(6.0)))
    e4 = sm.FORMATS["e4m3"]
    mids = e4.midpoints(include_clip=False)
    if quick:
        mids = mids[::4]
    vals = []
    for mu in mids:
        a0 = F32(F32(mu) / m)
        for k in range(-2, 3):
            a = a0
            for _ in range(abs(k)):
                a = np.nextafter(a, F32(np.inf) if k > 0 else F32(-np.inf))
            if 0 < a < amax_t:
                vals.append(float(a))
    rpt = 16 if tile16x16 else 1
    tiles = [np.zeros((rpt, 16))]
    tiles[0][0, 0] = amax_t
    rng = rng_for("scale_ties", amax_t, tile16x16)
    for i, a in enumerate(vals):
        t = rng.uniform(-1, 1, size=(rpt, 16)) * a
        t[rng.integers(rpt), rng.integers(16)] = a if i % 2 else -a
        tiles.append(t)
    per_row = 4
    nrow = -(-len(tiles) // per_row)
    out = np.zeros((nrow * rpt, per_row * 16))
    for i, t in enumerate(tiles):
        r, c = divmod(i, per_row)
        out[r * rpt:(r + 1) * rpt, c * 16:(c + 1) * 16] = t
    return out.astype(np.float32)


def inverse_rht(y):
    """x with x * (diag(s) H / 4) = y per 16-chunk along rows, computed in
    float64 (exact for the dyadic inputs we use; checked by the caller)."""
    m = sm.RHT_SIGNS[:, None] * sm.hadamard16() / 4.0
    r, c = y.shape
    ch = y.astype(np.float64).reshape(r, c // 16, 16)
    x = ch @ m.T
    return x.reshape(r, c)


def nvfp4_cases(tile16x16, rht, quick):
    """[(name, matrix for axis 1, required)]: required False marks shapes keel
    may reject (then reported as SKIP)."""
    rows_unit = 16 if tile16x16 else 1
    rng = rng_for("nvfp4", tile16x16, rht)
    cases = []
    if not rht:
        for name, y in nvfp4_tie_tensors(tile16x16, False, quick) + nvfp4_tie_tensors(tile16x16, True, quick):
            cases.append((name, y, True))
    else:
        # Ties and near-ties (midpoint +- 2^-12) in the rotated domain:
        # x = y * M^T is exact in fp32 for these dyadic y (checked), and so is
        # the forward transform.
        for name, y in (nvfp4_tie_tensors(tile16x16, False, quick)
                        + nvfp4_tie_tensors(tile16x16, True, quick, offset=2.0 ** -12)):
            x = inverse_rht(y)
            if not np.all(f32(x) == x):
                raise AssertionError("inverse RHT of %s is not exact in fp32" % name)
            cases.append((name, x.astype(np.float32), True))
    R = 32
    C = 64
    if not rht:
        for amax_t in [1000.0, 1.0, 3.3e-5]:
            cases.append(("scale_ties_%g" % amax_t, nvfp4_scale_ties(amax_t, tile16x16, quick), True))
    cases.append(("randn", rng.standard_normal((R if tile16x16 else 24, C)).astype(np.float32), True))
    # Block magnitudes spanning 1e-30 .. 1e30 (blocks far below the global
    # amax get E4M3 scale 0 or subnormal scales)
    a = rng.standard_normal((R, C)) * 10.0 ** rng.uniform(-30, 30, size=(R, C // 16)).repeat(16, axis=1)
    a[rng.integers(R), rng.integers(C)] *= 1e4
    cases.append(("outliers", np.clip(a, -3e38, 3e38).astype(np.float32), True))
    # Scale underflow: one large value, other blocks 1e-3 .. 1e-12 of it
    a = rng.standard_normal((R, C)) * 10.0 ** (-rng.integers(3, 13, size=(R, C // 16))).repeat(16, axis=1)
    a[0, 0] = 1000.0
    a[1, 16:32] = -a[1, 16:32]
    cases.append(("scale_underflow", a.astype(np.float32), True))
    # Zeros: all zero (+0 and -0): amax 0 -> S_enc FLT_MAX
    a = np.zeros((R, C), np.float32)
    a[::2] = -0.0
    cases.append(("all_zero", a, True))
    a = rng.standard_normal((R, C)).astype(np.float32)
    a[:, 16:32] = 0.0
    a[:, 32:48] = -0.0
    cases.append(("zero_blocks", a, True))
    # fp32 subnormals only (S_enc overflows to FLT_MAX, S_dec subnormal)
    bits = rng.integers(1, 1 << 23, size=(R, C), dtype=np.uint32)
    bits[::3] |= np.uint32(0x80000000)
    cases.append(("subnormals", bits.view(np.float32), True))
    a = rng.standard_normal((R, C)).astype(np.float32) * np.float32(1e-36)
    cases.append(("tiny_tensor", a, True))
    # Huge: values up to FLT_MAX (S_dec near FLT_MAX / 2688, products may overflow)
    a = rng.uniform(-1, 1, size=(R, C)) * 3.4e38
    a[5, 7] = FLT_MAX
    cases.append(("huge", np.clip(a, -FLT_MAX, FLT_MAX).astype(np.float32), True))
    # Random finite bit patterns
    bits = rng.integers(0, 1 << 32, size=(R, C), dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    cases.append(("random_bits", np.where(np.isfinite(x), x, F32(0.5)).astype(np.float32), True))
    # Specials (the reference's behaviour is what counts; docs/numerics.md, "NVFP4"
    # records it)
    a = rng.standard_normal((R, C)).astype(np.float32)
    a[3, 17] = np.inf
    cases.append(("inf", a, True))
    a = rng.standard_normal((R, C)).astype(np.float32)
    a[4, 40] = np.nan
    cases.append(("nan", a, True))
    # Shape whose rows do not divide 16 (fine for 1x16 along rows; 16x16 may be rejected)
    a = rng.standard_normal((20, 48)).astype(np.float32)
    cases.append(("rows20", a, not tile16x16))
    if quick:
        keep = {"ties_k0", "ties_k7", "tie_neighbours_k0", "scale_ties_1000", "randn", "outliers", "scale_underflow",
                "all_zero", "subnormals", "huge", "inf", "nan"}
        cases = [c for c in cases if c[0] in keep]
    return cases


def nvfp4_sr_input(tile16x16):
    rng = rng_for("nvfp4_sr", tile16x16)
    a = rng.standard_normal((64, 128)) * 10.0 ** rng.uniform(-2, 2, size=(64, 1))
    return a.astype(np.float32)
