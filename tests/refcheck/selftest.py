"""refcheck.py --self-test: checks the harness without keel-quant.

1. The references load and run.
2. The input generators produce what they claim (exact ties, tie neighbours,
   clip-range maxima, log2-risk maxima, NVFP4 ties with power-of-two scales,
   exact inverse RHT).
3. The harness run against the references themselves (an in-process fake
   keel-quant that writes the reference results through the same file
   plumbing) must PASS everywhere: this checks the packed layout, the axis /
   transpose handling and the comparisons.
4. The harness run against our exact model of docs/numerics.md: every FAIL there
   is a place where the spec and the reference disagree (informational; the
   list is summarised at the end).
5. Diagnostics: microxcaling on cpu vs cuda (when a GPU is visible), TE's RHT
   matmul vs an fp32 index-order sum.
"""

import collections
import os
import tempfile
import time

import numpy as np

import cases
import refcheck as rc
import spec_model as sm

torch = rc.torch


class Checks:
    def __init__(self):
        self.bad = 0

    def ok(self, cond, what):
        print("%s  %s" % ("ok  " if cond else "BAD ", what), flush=True)
        if not cond:
            self.bad += 1


def check_generators(ck, quick, nv_ref):
    print("== generators", flush=True)
    for fmt_name, elem in sm.MX_FORMATS.items():
        fmt = sm.FORMATS[elem]
        for block in ([32] if quick else [32, 16]):
            cl = dict(cases.mx_cases(elem, block, quick))
            # ties: every non-anchor nonzero element sits exactly on a midpoint
            for name, want_half in [("ties", True), ("tie_neighbours", False)]:
                x = cl[name]
                _, _, scales, _ = sm.mx_quantize(x, elem, block, 1, "nearest_even")
                e = scales.astype(np.int64) - 127
                e_elem = np.repeat(e, block, axis=1)[:, :x.shape[1]]
                w = x.astype(np.float64) * np.ldexp(1.0, -e_elem)
                aw = np.abs(w)
                p = np.maximum(sm.floor_log2_exact(np.where(aw > 0, aw, 1.0)), 1 - fmt.bias)
                n = aw / np.ldexp(1.0, p - fmt.mbits)
                frac = n - np.floor(n)
                anchor = aw == fmt.max_normal
                sel = (aw > 0) & ~anchor
                if want_half:
                    good = np.all(frac[sel] == 0.5)
                    ne = sm.round_elem_exact(w[sel], fmt, "nearest_even")
                    na = sm.round_elem_exact(w[sel], fmt, "nearest_away")
                    ndiff = int((ne != na).sum())
                    ck.ok(good and ndiff > 0, "%s block %d %s: %d elements, all exact ties; even != away at %d; "
                          "block exponents %s" % (fmt_name, block, name, sel.sum(), ndiff,
                                                  sorted(set(e.ravel().tolist()))))
                else:
                    good = np.all((frac[sel] != 0.5) & (np.abs(frac[sel] - 0.5) < 2.0 ** -5))
                    ck.ok(good, "%s block %d %s: %d elements, each within 2^-5 quantum of a tie, none a tie"
                          % (fmt_name, block, name, sel.sum()))
            # clip range maxima
            x = cl["clip_range"]
            blocks = x.reshape(x.shape[0], -1, block).astype(np.float64)
            amax = np.abs(blocks).max(axis=-1)
            amax = amax[amax > 0]  # drop the zero blocks that pad the last row
            e = sm.floor_log2_exact(amax) - fmt.emax
            wmax = amax * np.ldexp(1.0, -e)
            ck.ok(np.all((wmax >= fmt.max_normal) & (wmax < 2.0 ** (fmt.emax + 1))),
                  "%s block %d clip_range: %d block maxima in [max_normal, 2^(emax+1)) * 2^e"
                  % (fmt_name, block, amax.size))
            # pow2 edge: blocks where fp32 torch.log2 disagrees with the exact exponent
            x = cl["pow2_edge"]
            blocks = x.reshape(x.shape[0], -1, block)
            amax = np.abs(blocks).max(axis=-1)
            amax = amax[amax > 0]
            exact = sm.floor_log2_exact(amax.astype(np.float64))
            t = torch.floor(torch.log2(torch.from_numpy(amax.copy()))).numpy().astype(np.int64)
            nd = int((t != exact).sum())
            ck.ok(nd > 0, "%s block %d pow2_edge: %d of %d block maxima where floor(torch.log2(amax)) != "
                  "exact exponent (the microxcaling risk)" % (fmt_name, block, nd, amax.size))
            # half min subnormal
            x = cl["half_min_sub"]
            _, _, scales, _ = sm.mx_quantize(x, elem, block, 1, "nearest_even")
            e_elem = np.repeat(scales.astype(np.int64) - 127, block, axis=1)[:, :x.shape[1]]
            n = np.abs(x.astype(np.float64)) * np.ldexp(1.0, -e_elem) / fmt.min_subnormal
            cnt = int((n == 0.5 - 2.0 ** -25).sum())
            ck.ok(cnt > 0, "%s block %d half_min_sub: %d elements at exactly (0.5 - 2^-25) quanta"
                  % (fmt_name, block, cnt))

    for tile16 in [False, True]:
        for rht in [False, True]:
            for name, x, _ in cases.nvfp4_cases(tile16, rht, quick):
                if not name.startswith("tie"):
                    continue
                y = sm.rht_index_order(x, 1) if rht else x
                if rht:
                    ref_y = dict(cases.nvfp4_tie_tensors(tile16, False, quick)
                                 + cases.nvfp4_tie_tensors(tile16, True, quick, 2.0 ** -12)).get(name)
                    if ref_y is not None:
                        ck.ok(np.array_equal(y, ref_y), "nvfp4 %s rht: fp32 index-order RHT of the generated "
                              "input reproduces the intended rotated tensor exactly" % name)
                    if nv_ref is not None:
                        ty = nv_ref.rotate(x, 1)
                        ck.ok(np.array_equal(ty, y), "nvfp4 %s rht: TE's _apply_rht agrees with the fp32 "
                              "index-order RHT on this input" % name)
                _, codes, scales, s_dec, t = sm.nvfp4_quantize(y, tile16, False, 1)
                sf = sm.FORMATS["e4m3"].decode(scales)
                at = np.abs(t.astype(np.float64))
                mids = np.isin(at, cases.E2M1_MIDS)
                pow2 = np.all((sf == 0) | (sf == 448) | (np.frexp(sf)[0] == 0.5))
                is_pow2_sdec = np.frexp(np.float64(s_dec))[0] == 0.5
                if name.startswith("ties"):
                    nz = (at > 0) & (at != 6.0)
                    good = np.all(mids[nz]) and pow2 and is_pow2_sdec
                    ck.ok(good, "nvfp4 tile=%s rht=%s %s: %d elements, every x*s_b that is not 0 or 6 is an E2M1 "
                          "midpoint; block scales and S_dec powers of two" % ("16x16" if tile16 else "1x16",
                                                                            rht, name, int(nz.sum())))
                else:
                    nz = (at > 0) & (at < 6.0) & (np.abs(at - 6.0) > 1e-3)
                    near = np.min(np.abs(at[..., None] - np.array(cases.E2M1_MIDS)), axis=-1)
                    good = np.all((near[nz] > 0) & (near[nz] <= 2.0 ** -12))
                    ck.ok(good, "nvfp4 tile=%s rht=%s %s: %d elements within 2^-12 of a midpoint, none on one"
                          % ("16x16" if tile16 else "1x16", rht, name, int(nz.sum())))


def run_harness(args, model, mx_ref, nv_ref, quiet):
    tally = rc.Tally()
    import io
    import contextlib
    buf = io.StringIO()
    with tempfile.TemporaryDirectory(prefix="refcheck.self.") as tmp:
        runner = rc.FakeRunner(model, tmp, mx_ref, nv_ref)
        h = rc.Harness(args, runner, mx_ref, nv_ref, tally)
        ctx = contextlib.redirect_stdout(buf) if quiet else contextlib.nullcontext()
        with ctx:
            if args.only in (None, "mx"):
                rc.run_mx(h, args, ["cpu"])
            if args.only in (None, "nvfp4") and nv_ref is not None:
                rc.run_nvfp4(h, args, ["cpu"])
    return tally, buf.getvalue()


def summarize_discrepancies(text):
    """Groups FAIL lines of the spec-model run by (format, case)."""
    groups = collections.OrderedDict()
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("FAIL"):
            continue
        parts = line.split()
        fmt = parts[1]
        case = next((p for p in parts if p.startswith("case=")), "case=?")[5:]
        key = (fmt, case)
        g = groups.setdefault(key, dict(n=0, first=line, ex=[]))
        g["n"] += 1
        j = i + 1
        while j < len(lines) and lines[j].startswith("       ") and len(g["ex"]) < 3:
            g["ex"].append(lines[j].strip())
            j += 1
    return groups


def nvfp4_legacy_order(ck, quick):
    """How often TE's pre-v2.15 scale order ((amax_b / 6) * S_enc) gives other
    results than the spec / current TE order (amax_b * (S_enc * (1/6)))."""
    print("== NVFP4 scale order: spec (= TE >= v2.15) vs TE < v2.15, on our cases", flush=True)
    for tile16 in [False, True]:
        for name, x, _ in cases.nvfp4_cases(tile16, False, quick):
            if x.shape[1] % 16 or (tile16 and x.shape[0] % 16):
                continue
            a = sm.nvfp4_quantize(x, tile16, False, 1)
            b = sm.nvfp4_quantize(x, tile16, False, 1, scale_order="legacy_te")
            ns = int((a[2] != b[2]).sum())
            nc = int((a[1] != b[1]).sum())
            if ns or nc:
                print("     tile=%s %-22s scales differ: %d, codes differ: %d" % ("16x16" if tile16 else "1x16",
                                                                               name, ns, nc), flush=True)


def rht_diagnostics(ck, nv_ref):
    print("== RHT: TE's _apply_rht (torch matmul, %s) vs fp32 index-order sum" % nv_ref.device, flush=True)
    rng = np.random.default_rng(7)
    tests = {
        "randn": rng.standard_normal((64, 64)).astype(np.float32),
        "wide_range": (rng.standard_normal((64, 64)) * 10.0 ** rng.uniform(-20, 20, (64, 64))).astype(np.float32),
        "subnormal": rng.integers(1, 1 << 23, size=(64, 64), dtype=np.uint32).view(np.float32),
        "huge": (rng.uniform(-1, 1, (64, 64)) * 3.0e38).astype(np.float32),
    }
    for name, x in tests.items():
        te = nv_ref.rotate(x, 1)
        ours = sm.rht_index_order(x, 1)
        d = rc.compare_values(te, ours)
        print("     %-10s elements differing: %d (+0/-0: %d)" % (name, d["mism"], d["zsign"]), flush=True)


def mx_cross_device(mx_ref_cpu, refs_dir, quick):
    if not torch.cuda.is_available():
        print("== microxcaling cpu vs cuda: no GPU visible, skipped", flush=True)
        return
    print("== microxcaling cpu vs cuda (the reference against itself)", flush=True)
    mx_gpu = rc.refs.MxReference(refs_dir, "cuda")
    for fmt_name, elem in sm.MX_FORMATS.items():
        for name, a in cases.mx_cases(elem, 32, quick):
            for rounding in rc.MX_ROUNDINGS:
                a_ = mx_ref_cpu.quantize(a, elem, 32, 1, rounding)
                b_ = mx_gpu.quantize(a, elem, 32, 1, rounding)
                d = rc.compare_values(a_["out"], b_["out"])
                if d["mism"] or d["zsign"]:
                    print("     DIFF %s %s %s: %d elements (+0/-0 %d)" % (fmt_name, rounding, name, d["mism"],
                                                                      d["zsign"]), flush=True)


def run(args, mx_ref, nv_ref, nv_why):
    t0 = time.time()
    ck = Checks()
    print("== references", flush=True)
    x = np.array([[1.0, -2.5, 3.0e-3, 0.0] * 8], np.float32)
    r = mx_ref.quantize(x, "e4m3", 32, 1, "nearest_even")
    ck.ok(np.isfinite(r["out"]).all(), "microxcaling quantize_mx_op (pure PyTorch, custom_cuda=False) runs")
    if nv_ref is None:
        print("SKIP TE NVFP4 reference unavailable here: %s" % nv_why, flush=True)
    else:
        r = nv_ref.quantize(np.tile(x, (16, 1))[:, :32], False, False, 1)
        ck.ok(r["codes"].shape == (16, 32), "TE NVFP4QuantizerRef (with te_shims) runs")
    check_generators(ck, args.quick, nv_ref)
    nvfp4_legacy_order(ck, args.quick)
    if nv_ref is not None:
        rht_diagnostics(ck, nv_ref)
    mx_cross_device(mx_ref, args.refs or os.path.join(os.path.dirname(os.path.dirname(rc.HERE)), ".refs"),
                    args.quick)

    print("== harness vs the references themselves (every case must PASS)", flush=True)
    tally, text = run_harness(args, "ref", mx_ref, nv_ref, quiet=not args.verbose)
    ck.ok(tally.failed == 0, "harness vs references: %d PASS, %d FAIL, %d SKIP" % (tally.passed, tally.failed,
                                                                                 tally.skipped))
    for line in tally.fail_lines[:20]:
        print("     " + line)

    print("== harness vs our exact model of docs/numerics.md (FAILs = spec-vs-reference discrepancies)", flush=True)
    tally2, text2 = run_harness(args, "spec", mx_ref, nv_ref, quiet=True)
    print("     %d PASS, %d FAIL, %d SKIP" % (tally2.passed, tally2.failed, tally2.skipped))
    for (fmt, case), g in summarize_discrepancies(text2).items():
        print("     %-10s %-16s %d failing runs, e.g.:" % (fmt, case, g["n"]))
        print("        " + " ".join(g["first"].split()[1:]))
        for e in g["ex"]:
            print("          " + e)
    if args.verbose:
        print(text2)
    print("\nself-test: %s (%d problems, %.0fs)" % ("OK" if ck.bad == 0 else "FAILED", ck.bad, time.time() - t0))
    return 0 if ck.bad == 0 else 1
