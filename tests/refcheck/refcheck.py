#!/usr/bin/env python3
"""Bit-exactness harness: keel-quant against microxcaling's quantize_mx_op and
TransformerEngine's NVFP4 reference quantizer. See README.md.

  python3 tests/refcheck/refcheck.py --keel-quant bazel-bin/kernels/keel-quant [--refs .refs] [--quick]
  python3 tests/refcheck/refcheck.py --self-test [--refs .refs] [--quick]

Exit status: 0 all PASS (SKIPs allowed), 1 any FAIL, 2 usage / setup error.
"""

import argparse
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def _maybe_reexec_for_torch():
    """This machine's default python3 (pyenv) has no torch while Debian's
    /usr/bin/python3 does: re-run under the one that has it."""
    try:
        import torch  # noqa: F401
        import numpy  # noqa: F401
        return
    except ImportError:
        pass
    if os.environ.get("REFCHECK_NO_REEXEC"):
        return
    for cand in ["/usr/bin/python3", "/usr/local/bin/python3"]:
        if os.path.exists(cand) and os.path.realpath(cand) != os.path.realpath(sys.executable):
            ok = subprocess.run([cand, "-c", "import torch, numpy"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL).returncode == 0
            if ok:
                print("refcheck: %s has no torch/numpy; re-running under %s" % (sys.executable, cand),
                      file=sys.stderr)
                os.environ["REFCHECK_NO_REEXEC"] = "1"
                os.execv(cand, [cand] + sys.argv)


_maybe_reexec_for_torch()

import numpy as np  # noqa: E402

import cases  # noqa: E402
import refs  # noqa: E402
import spec_model as sm  # noqa: E402

torch = refs.torch

MX_FORMATS = list(sm.MX_FORMATS)          # keel names
MX_ROUNDINGS = ["nearest_even", "nearest_away"]


# ----------------------------------------------------------------------------
# Formatting helpers
# ----------------------------------------------------------------------------
def hexf(v):
    v = np.float32(v)
    return "0x%08x(%.9g)" % (int(np.array(v).view(np.uint32)), float(v))


class Tally:
    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.skipped = 0
        self.fail_lines = []
        self.zsign_lines = []

    def add(self, status, line):
        if status == "PASS":
            self.passed += 1
        elif status == "SKIP":
            self.skipped += 1
        else:
            self.failed += 1
            self.fail_lines.append(line)


# ----------------------------------------------------------------------------
# Comparisons
# ----------------------------------------------------------------------------
def compare_values(ref, got, mask=None):
    """Bitwise float32 comparison; NaN == NaN (any payload); +0/-0
    differences counted apart. mask: elements to skip. Returns dict."""
    ref = np.asarray(ref, np.float32)
    got = np.asarray(got, np.float32)
    rb = ref.view(np.uint32)
    gb = got.view(np.uint32)
    both_nan = np.isnan(ref) & np.isnan(got)
    differ = (rb != gb) & ~both_nan
    if mask is not None:
        differ &= ~mask
    zero_sign = differ & (ref == 0) & (got == 0)
    mism = differ & ~zero_sign
    maxdiff = 0.0
    if mism.any():
        r = ref[mism].astype(np.float64)
        g = got[mism].astype(np.float64)
        with np.errstate(invalid="ignore"):
            d = np.abs(r - g)
        d = np.where(np.isnan(d), np.inf, d)
        maxdiff = float(d.max())
    return dict(mism=int(mism.sum()), zsign=int(zero_sign.sum()), maxdiff=maxdiff,
                mism_idx=np.argwhere(mism), zsign_idx=np.argwhere(zero_sign))


def compare_codes(ref_codes, got_codes, bits, mask=None):
    """Element codes: a +0 / -0 code difference is counted apart."""
    ref_codes = np.asarray(ref_codes, np.uint8).ravel()
    got_codes = np.asarray(got_codes, np.uint8).ravel()
    sign = np.uint8(1 << (bits - 1))
    differ = ref_codes != got_codes
    if mask is not None:
        differ &= ~np.asarray(mask).ravel()
    zero = ((ref_codes & ~sign) == 0) & ((got_codes & ~sign) == 0)
    return int((differ & ~zero).sum()), int((differ & zero).sum()), np.flatnonzero(differ & ~zero)


def e4m3_bytes_equal(a, b):
    a = np.asarray(a, np.uint8)
    b = np.asarray(b, np.uint8)
    nan_a = (a & 0x7F) == 0x7F
    nan_b = (b & 0x7F) == 0x7F
    return (a == b) | (nan_a & nan_b)


# ----------------------------------------------------------------------------
# keel-quant runners
# ----------------------------------------------------------------------------
class RunResult:
    def __init__(self, rc, err, out=None, packed=None):
        self.rc = rc
        self.err = err
        self.out = out
        self.packed = packed


class KeelRunner:
    """Runs the keel-quant binary (or any command with its CLI)."""

    def __init__(self, cmd, tmpdir, timeout=300):
        self.cmd = cmd
        self.tmpdir = tmpdir
        self.timeout = timeout
        self.count = 0

    prefix = "c"

    def invoke(self, argv):
        """Runs the quantizer on the flags argv; returns (exit status, its messages)."""
        try:
            p = subprocess.run(self.cmd + argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               timeout=self.timeout)
            return p.returncode, (p.stderr.decode(errors="replace") + p.stdout.decode(errors="replace")).strip()
        except subprocess.TimeoutExpired:
            return -1, "timed out after %ds" % self.timeout

    def run(self, x, args):
        self.count += 1
        base = os.path.join(self.tmpdir, "%s%d" % (self.prefix, self.count))
        xin, yout, pout = base + ".in.f32", base + ".out.f32", base + ".packed.bin"
        np.ascontiguousarray(x, dtype="<f4").tofile(xin)
        rows, cols = x.shape
        rc, err = self.invoke(["--rows", str(rows), "--cols", str(cols), "--in", xin, "--out", yout,
                               "--packed-out", pout] + args)
        res = RunResult(rc, err)
        if rc == 0:
            try:
                out = np.fromfile(yout, dtype="<f4")
                if out.size != rows * cols:
                    res.rc, res.err = -2, "--out has %d floats, want %d" % (out.size, rows * cols)
                else:
                    res.out = out.reshape(rows, cols).astype(np.float32)
                res.packed = open(pout, "rb").read() if os.path.exists(pout) else None
            except OSError as e:
                res.rc, res.err = -2, "cannot read outputs: %s" % e
        for f in (xin, yout, pout):
            if os.path.exists(f):
                os.remove(f)
        return res


def fake_keel_main(argv, model, mx_ref=None, nv_ref=None):
    """An in-process stand-in with keel-quant's CLI (self-test only).
    model 'spec': our exact model of docs/numerics.md (spec_model.py); 'ref': the references."""
    ap = argparse.ArgumentParser(prog="fake-keel-quant")
    for f in ["--format", "--rows", "--cols", "--in", "--out", "--axis", "--block", "--rounding", "--seed",
              "--tile", "--device", "--packed-out"]:
        ap.add_argument(f)
    ap.add_argument("--rht", action="store_true")
    a = ap.parse_args(argv)
    rows, cols = int(a.rows), int(a.cols)
    axis = int(a.axis or 1)
    x = np.fromfile(a.__dict__["in"], dtype="<f4").reshape(rows, cols)
    seed = int(a.seed or 0)
    if a.format in sm.MX_FORMATS:
        elem = sm.MX_FORMATS[a.format]
        block = int(a.block or 32)
        rounding = a.rounding or "nearest_even"
        if model == "ref" and rounding != "stochastic":
            r = mx_ref.quantize(x, elem, block, axis, rounding)
            out, codes, scales = r["out"], r["codes"], r["scales"]
        else:
            out, codes, scales, _ = sm.mx_quantize(x, elem, block, axis, rounding, seed)
        packed = sm.pack_codes(codes, elem).tobytes() + scales.astype(np.uint8).tobytes()
    elif a.format == "nvfp4":
        tile = a.tile == "16x16"
        if (axis == 1 and cols % 16) or (axis == 0 and rows % 16):
            return 2, "fake-keel-quant: error: shape not divisible by the tile"
        rounding = a.rounding or "nearest_even"
        if model == "ref" and rounding != "stochastic":
            r = nv_ref.quantize(x, tile, a.rht, axis)
            out, codes, scales, s_dec = r["out"], r["codes"], r["scales"], r["s_dec"]
        else:
            out, codes, scales, s_dec, _ = sm.nvfp4_quantize(x, tile, a.rht, axis, rounding, seed)
        packed = (sm.pack_codes(codes, "e2m1").tobytes() + scales.astype(np.uint8).tobytes()
                  + np.float32(s_dec).astype("<f4").tobytes())
    else:
        return 2, "fake-keel-quant: error: format %s not modelled" % a.format
    np.ascontiguousarray(out, dtype="<f4").tofile(a.out)
    if a.packed_out:
        with open(a.packed_out, "wb") as f:
            f.write(packed)
    return 0, ""


class FakeRunner(KeelRunner):
    """Same file plumbing as KeelRunner, quantizer in-process."""

    def __init__(self, model, tmpdir, mx_ref, nv_ref):
        super().__init__(["fake"], tmpdir)
        self.model = model
        self.mx_ref = mx_ref
        self.nv_ref = nv_ref

    prefix = "f"

    def invoke(self, argv):
        return fake_keel_main(argv, self.model, self.mx_ref, self.nv_ref)


def sr_seeds(fields):
    """Two seeds per stochastic case, different for every case."""
    import zlib
    h = zlib.crc32(" ".join(fields).encode())
    return str(1000 + h), str(7_000_000_000 + h)


# ----------------------------------------------------------------------------
# Packed-file splitting
# ----------------------------------------------------------------------------
def split_packed(packed, rows, cols, elem, nscales, tensor_scale):
    ncode = sm.packed_code_bytes(rows * cols, elem)
    want = ncode + nscales + (4 if tensor_scale else 0)
    if packed is None:
        return None, "no packed file"
    if len(packed) != want:
        return None, "packed file has %d bytes, want %d (codes %d + scales %d%s)" % (
            len(packed), want, ncode, nscales, " + 4" if tensor_scale else "")
    codes = sm.unpack_codes(packed[:ncode], rows * cols, elem).reshape(rows, cols)
    scales = np.frombuffer(packed[ncode:ncode + nscales], np.uint8)
    ts = np.frombuffer(packed[ncode + nscales:], "<f4")[0] if tensor_scale else None
    return (codes, scales, ts), ""


# ----------------------------------------------------------------------------
# Case runner
# ----------------------------------------------------------------------------
class Harness:
    def __init__(self, args, runner, mx_ref, nv_ref, tally):
        self.args = args
        self.runner = runner
        self.mx_ref = mx_ref
        self.nv_ref = nv_ref
        self.tally = tally
        self.examples = args.examples
        self.strict_zero = args.strict_zero_sign

    def emit(self, status, fields, details=()):
        line = "%-4s %s" % (status, " ".join(fields))
        print(line, flush=True)
        if any((f.startswith("zsign=") and f != "zsign=0") or (",zcodes:" in f and ",zcodes:0," not in f)
               for f in fields):
            self.tally.zsign_lines.append(line)
        for d in details:
            print("       " + d, flush=True)
        self.tally.add(status, line if not details else line + "\n       " + "\n       ".join(details))

    def examples_for(self, x, ref, got, idx, shape):
        out = []
        for k in idx[: self.examples]:
            k = tuple(int(i) for i in (k if np.ndim(k) else np.unravel_index(int(k), shape)))
            out.append("[%d,%d] in=%s ref=%s keel=%s" % (k[0], k[1], hexf(x[k]), hexf(ref[k]), hexf(got[k])))
        return out

    # ---------------- MX ----------------
    def mx_case(self, name, x, fmt, rounding, axis, block, devices):
        elem = sm.MX_FORMATS[fmt]
        rows, cols = x.shape
        fields = ["%-10s" % fmt, "%-12s" % rounding, "axis=%d" % axis, "block=%-2d" % block, "rht=-",
                  "shape=%dx%d" % (rows, cols), "case=%s" % name]
        try:
            ref = self.mx_ref.quantize(x, elem, block, axis, rounding)
        except Exception as e:  # noqa: BLE001
            self.emit("FAIL", fields + ["reference raised %s: %s" % (type(e).__name__, str(e)[:300])])
            return
        outs = {}
        for dev in devices:
            args = ["--format", fmt, "--axis", str(axis), "--block", str(block), "--rounding", rounding,
                    "--device", dev]
            res = self.runner.run(x, args)
            f = fields + ["dev=%s" % dev]
            if res.rc != 0:
                self.emit("FAIL", f + ["keel-quant exit %d: %s" % (res.rc, res.err[:300])])
                continue
            outs[dev] = res
            cv = compare_values(ref["out"], res.out)
            details = []
            nsc = ref["scales"].size
            split, why = split_packed(res.packed, rows, cols, elem, nsc, False)
            pk = "packed=ok"
            pk_bad = False
            if split is None:
                pk, pk_bad = "packed=BAD(%s)" % why, True
            else:
                codes, scales, _ = split
                cm, cz, cidx = compare_codes(ref["codes"], codes, sm.FORMATS[elem].bits, ref["code_mask"])
                sm_bad = np.flatnonzero(scales != ref["scales"].ravel())
                if cm or len(sm_bad) or (cz and self.strict_zero):
                    pk_bad = True
                pk = "packed=codes:%d,zcodes:%d,scales:%d" % (cm, cz, len(sm_bad))
                if len(sm_bad):
                    k = sm_bad[0]
                    details.append("scale[%d]: ref=0x%02x keel=0x%02x" % (k, ref["scales"].ravel()[k], scales[k]))
                if cm:
                    k = cidx[0]
                    details.append("code[%d]: ref=0x%02x keel=0x%02x" % (k, ref["codes"].ravel()[k],
                                                                          codes.ravel()[k]))
            if ref["code_note"]:
                details.append("note: " + ref["code_note"])
            bad = cv["mism"] > 0 or pk_bad or (self.strict_zero and cv["zsign"] > 0)
            status = "FAIL" if bad else "PASS"
            if cv["mism"]:
                details = self.examples_for(x, ref["out"], res.out, cv["mism_idx"], x.shape) + details
            if cv["zsign"]:
                details += ["(+0/-0) " + s for s in self.examples_for(x, ref["out"], res.out, cv["zsign_idx"],
                                                                       x.shape)[:2]]
            self.emit(status, f + ["mism=%d" % cv["mism"], "zsign=%d" % cv["zsign"],
                                   "maxdiff=%.3g" % cv["maxdiff"], pk], details if (bad or self.args.verbose) else ())
        self.cross_device(fields, outs)

    def sr_runs(self, x, base, fields, ff):
        """Runs keel-quant three times for a stochastic-rounding check: twice with one
        seed (must reproduce) and once with another (must differ). Returns the three
        runs, or None after emitting a FAIL when any run exits non-zero."""
        s1, s3 = sr_seeds(fields)
        r1 = self.runner.run(x, base + ["--seed", s1])
        r2 = self.runner.run(x, base + ["--seed", s1])
        r3 = self.runner.run(x, base + ["--seed", s3])
        if r1.rc or r2.rc or r3.rc:
            self.emit("FAIL", ff + ["keel-quant exit %d: %s" % (r1.rc or r2.rc or r3.rc,
                                                               (r1.err or r2.err or r3.err)[:300])])
            return None
        return r1, r2, r3

    def sr_on_devices(self, x, flags, fields, devices, verdict):
        """The stochastic-rounding check of one case on each device (keel-quant flags
        plus --device), verdict(fields, r1, r2, r3) giving what to emit, then the
        devices compared with each other."""
        outs = {}
        for dev in devices:
            ff = fields + ["dev=%s" % dev]
            runs = self.sr_runs(x, flags + ["--device", dev], fields, ff)
            if runs is None:
                continue
            outs[dev] = runs[0]
            self.emit(*verdict(ff, *runs))
        self.cross_device(fields, outs)

    def cross_device(self, fields, outs):
        if len(outs) < 2:
            return
        devs = list(outs)
        a, b = outs[devs[0]], outs[devs[1]]
        cv = compare_values(a.out, b.out)
        same_packed = a.packed == b.packed
        bad = cv["mism"] or cv["zsign"] or not same_packed
        self.emit("FAIL" if bad else "PASS", fields + ["dev=%s-vs-%s" % (devs[0], devs[1]), "mism=%d" % cv["mism"],
                                                      "zsign=%d" % cv["zsign"],
                                                      "packed=%s" % ("same" if same_packed else "DIFFERENT")])

    def mx_sr_case(self, fmt, axis, block, devices):
        elem = sm.MX_FORMATS[fmt]
        f = sm.FORMATS[elem]
        x = cases.mx_sr_input(elem, block)
        if axis == 0:
            x = np.ascontiguousarray(x.T)
        rows, cols = x.shape
        fields = ["%-10s" % fmt, "%-12s" % "stochastic", "axis=%d" % axis, "block=%-2d" % block, "rht=-",
                  "shape=%dx%d" % (rows, cols), "case=sr_properties"]
        e = self.mx_ref.shared_exponents(x, elem, block, axis)
        e_elem = np.repeat(e, block, axis=1)[:, :cols] if axis == 1 else np.repeat(e, block, axis=0)[:rows, :]
        scale = np.ldexp(1.0, np.nan_to_num(e_elem).astype(np.int64))
        w = x.astype(np.float64) / scale
        lo = sm.round_elem_exact(w, f, "floor") * scale
        hi = sm.round_elem_exact(w, f, "up") * scale
        ref_scales = np.where(np.isnan(e), 0xFF, np.nan_to_num(e) + 127).astype(np.uint8)
        flags = ["--format", fmt, "--axis", str(axis), "--block", str(block), "--rounding", "stochastic"]
        self.sr_on_devices(x, flags, fields, devices,
                           lambda ff, r1, r2, r3: self._sr_verdict(ff, x, r1, r2, r3, lo, hi, w, scale, elem,
                                                                   ref_scales, None))

    def _sr_verdict(self, ff, x, r1, r2, r3, lo, hi, w, scale, elem, ref_scales, extra):
        """MX stochastic rounding: every output is one of the two grid
        neighbours (computed with the reference's block exponents), the
        up-rounding rate matches the fractions (|z| <= 6), the same seed
        reproduces the output, another seed changes it, scales match."""
        lo32, hi32 = lo.astype(np.float32), hi.astype(np.float32)
        gb = r1.out.view(np.uint32)
        exact = (gb == lo32.view(np.uint32)) | (gb == hi32.view(np.uint32))
        zero_only = ~exact & (r1.out == 0) & ((lo32 == 0) | (hi32 == 0))
        bad_elem = ~exact & ~zero_only
        random = lo32 != hi32
        span = np.abs(hi) - np.abs(lo)
        with np.errstate(invalid="ignore", divide="ignore"):
            frac = np.where(random, (np.abs(x.astype(np.float64)) - np.abs(lo)) / np.where(span > 0, span, 1), 0)
        # z over both seeds' runs (a single seed's counters give correlated z across cases)
        ups = sum(int(((np.abs(r.out.astype(np.float64)) == np.abs(hi)) & random).sum()) for r in (r1, r3))
        var = 2 * (frac[random] * (1 - frac[random])).sum()
        z = (ups - 2 * frac[random].sum()) / math.sqrt(var) if var > 0 else 0.0
        determinism = r1.out.tobytes() == r2.out.tobytes() and r1.packed == r2.packed
        seed_effect = r1.out.tobytes() != r3.out.tobytes()
        details = []
        split, why = split_packed(r1.packed, x.shape[0], x.shape[1], elem, ref_scales.size, False)
        scale_mism = 0
        if split is not None:
            scale_mism = int((split[1] != ref_scales.ravel()).sum())
        else:
            details.append(why)
        bad = bool(bad_elem.any()) or not determinism or not seed_effect or abs(z) > 6 or scale_mism \
            or split is None or (self.strict_zero and zero_only.any())
        for k in np.argwhere(bad_elem)[: self.examples]:
            k = tuple(k)
            details.append("[%d,%d] in=%s allowed=%s|%s keel=%s" % (k[0], k[1], hexf(x[k]), hexf(lo32[k]),
                                                                  hexf(hi32[k]), hexf(r1.out[k])))
        fields = ff + ["off_grid=%d" % int(bad_elem.sum()), "zsign=%d" % int(zero_only.sum()), "z=%.2f" % z,
                       "deterministic=%s" % ("yes" if determinism else "NO"),
                       "seed_changes_output=%s" % ("yes" if seed_effect else "NO"), "scales_mism=%d" % scale_mism]
        return ("FAIL" if bad else "PASS", fields, details if (bad or self.args.verbose) else ())

    # ---------------- NVFP4 ----------------
    def nvfp4_case(self, name, x, tile16, rht, axis, required, devices):
        rows, cols = x.shape
        fields = ["%-10s" % "nvfp4", "%-12s" % "nearest_even", "axis=%d" % axis,
                  "tile=%-5s" % ("16x16" if tile16 else "1x16"), "rht=%s" % ("y" if rht else "-"),
                  "shape=%dx%d" % (rows, cols), "case=%s" % name]
        # The reference zero-pads 16x16 tiles across the other axis (compared
        # if keel accepts the shape); a quantization axis that 16 does not
        # divide is not compared (TE's packing and RHT need it).
        ref_ok = not ((axis == 1 and cols % 16) or (axis == 0 and rows % 16))
        outs = {}
        ref = None
        for dev in devices:
            args = ["--format", "nvfp4", "--axis", str(axis), "--tile", "16x16" if tile16 else "1x16",
                    "--device", dev] + (["--rht"] if rht else [])
            res = self.runner.run(x, args)
            ff = fields + ["dev=%s" % dev]
            if res.rc != 0:
                if not required and res.rc == 2:
                    self.emit("SKIP", ff + ["keel-quant rejects this shape: %s" % res.err[:200]])
                else:
                    self.emit("FAIL", ff + ["keel-quant exit %d: %s" % (res.rc, res.err[:300])])
                continue
            outs[dev] = res
            if not ref_ok:
                self.emit("SKIP", ff + ["keel accepts a shape the tile does not divide; not compared"])
                continue
            if ref is None:
                try:
                    ref = self.nv_ref.quantize(x, tile16, rht, axis)
                except Exception as e:  # noqa: BLE001
                    self.emit("FAIL", ff + ["reference raised %s: %s" % (type(e).__name__, str(e)[:300])])
                    continue
            xin = x if not rht else self.nv_ref.rotate(x, axis)
            cv = compare_values(ref["out"], res.out)
            details = []
            nsc = ref["scales"].size
            split, why = split_packed(res.packed, rows, cols, "e2m1", nsc, True)
            pk_bad = False
            if split is None:
                pk, pk_bad = "packed=BAD(%s)" % why, True
            else:
                codes, scales, s_dec = split
                cm, cz, cidx = compare_codes(ref["codes"], codes, 4)
                s_ok = e4m3_bytes_equal(scales, ref["scales"].ravel())
                sbad = np.flatnonzero(~s_ok)
                sdec_ok = (np.float32(s_dec).view(np.uint32) == np.float32(ref["s_dec"]).view(np.uint32)) or (
                    np.isnan(s_dec) and np.isnan(ref["s_dec"]))
                pk = "packed=codes:%d,zcodes:%d,scales:%d,s_dec:%s" % (cm, cz, len(sbad), "ok" if sdec_ok else "BAD")
                if cm or len(sbad) or not sdec_ok or (cz and self.strict_zero):
                    pk_bad = True
                if not sdec_ok:
                    details.append("S_dec: ref=%s keel=%s (global amax ref=%s)" % (hexf(ref["s_dec"]), hexf(s_dec),
                                                                                   hexf(ref["amax"])))
                if len(sbad):
                    k = sbad[0]
                    details.append("scale[%d]: ref=0x%02x keel=0x%02x (%d differ)" % (
                        k, ref["scales"].ravel()[k], scales[k], len(sbad)))
                if cm:
                    for k in cidx[: self.examples]:
                        rc_, cc_ = np.unravel_index(k, x.shape)
                        details.append("code[%d,%d]: in=%s t=%s ref=0x%x keel=0x%x" % (
                            rc_, cc_, hexf(xin[rc_, cc_]), hexf(ref["t"][rc_, cc_]), ref["codes"][rc_, cc_],
                            codes[rc_, cc_]))
            bad = cv["mism"] > 0 or pk_bad or (self.strict_zero and cv["zsign"] > 0)
            if cv["mism"]:
                details = self.examples_for(xin, ref["out"], res.out, cv["mism_idx"], x.shape) + details
                if rht:
                    details.insert(0, "(in= is the reference's rotated input)")
            if cv["zsign"]:
                details += ["(+0/-0) " + s for s in self.examples_for(xin, ref["out"], res.out, cv["zsign_idx"],
                                                                       x.shape)[:2]]
            self.emit("FAIL" if bad else "PASS",
                      ff + ["mism=%d" % cv["mism"], "zsign=%d" % cv["zsign"], "maxdiff=%.3g" % cv["maxdiff"], pk],
                      details if (bad or self.args.verbose) else ())
        self.cross_device(fields, outs)

    def nvfp4_sr_case(self, tile16, rht, axis, devices):
        x = cases.nvfp4_sr_input(tile16)
        if axis == 0:
            x = np.ascontiguousarray(x.T)
        rows, cols = x.shape
        fields = ["%-10s" % "nvfp4", "%-12s" % "stochastic", "axis=%d" % axis,
                  "tile=%-5s" % ("16x16" if tile16 else "1x16"), "rht=%s" % ("y" if rht else "-"),
                  "shape=%dx%d" % (rows, cols), "case=sr_properties"]
        ref = self.nv_ref.quantize(x, tile16, rht, axis)
        t = ref["t"].astype(np.float64)
        f = sm.FORMATS["e2m1"]
        lo_q = sm.round_elem_exact(t, f, "floor")
        hi_q = sm.round_elem_exact(t, f, "up")
        flags = ["--format", "nvfp4", "--axis", str(axis), "--tile", "16x16" if tile16 else "1x16",
                 "--rounding", "stochastic"] + (["--rht"] if rht else [])
        # frac is measured on t (the scaled value), candidates on the output
        self.sr_on_devices(x, flags, fields, devices,
                           lambda ff, r1, r2, r3: self._sr_verdict_nv(ff, axis, t, r1, r2, r3, lo_q, hi_q, ref))

    @staticmethod
    def _nv_sf_elem(ref, axis, rows, cols):
        s = ref["scales"]
        sf = sm.FORMATS["e4m3"].decode(s).astype(np.float32)
        if axis == 1:
            return np.repeat(sf, 16, axis=1)[:, :cols]
        return np.repeat(sf, 16, axis=0)[:rows, :]

    def _sr_verdict_nv(self, ff, axis, t, r1, r2, r3, lo_q, hi_q, ref):
        rows, cols = t.shape
        details = []
        split, why = split_packed(r1.packed, rows, cols, "e2m1", ref["scales"].size, True)
        if split is None:
            return ("FAIL", ff + ["packed=BAD(%s)" % why], ())
        codes, scales, s_dec = split
        q = sm.FORMATS["e2m1"].decode(codes)
        q_ok = (q == lo_q) | (q == hi_q)
        off = ~q_ok
        s_ok = e4m3_bytes_equal(scales, ref["scales"].ravel())
        sdec_ok = np.float32(s_dec).view(np.uint32) == np.float32(ref["s_dec"]).view(np.uint32)
        # keel's dequantized output must be its own codes dequantized
        sf_elem = self._nv_sf_elem(ref, axis, rows, cols)
        own = ((q.astype(np.float32) * sf_elem).astype(np.float32) * np.float32(ref["s_dec"])).astype(np.float32)
        cv = compare_values(own, r1.out)
        random = lo_q != hi_q
        with np.errstate(invalid="ignore", divide="ignore"):
            frac = np.where(random, (np.abs(t) - np.abs(lo_q)) / np.where(random, np.abs(hi_q) - np.abs(lo_q), 1), 0)
        ups = int(((np.abs(q) == np.abs(hi_q)) & random).sum())
        split3, _ = split_packed(r3.packed, rows, cols, "e2m1", ref["scales"].size, True)
        if split3 is not None:
            q3 = sm.FORMATS["e2m1"].decode(split3[0])
            ups += int(((np.abs(q3) == np.abs(hi_q)) & random).sum())
        n_runs = 2 if split3 is not None else 1
        var = n_runs * (frac[random] * (1 - frac[random])).sum()
        z = (ups - n_runs * frac[random].sum()) / math.sqrt(var) if var > 0 else 0.0
        determinism = r1.out.tobytes() == r2.out.tobytes() and r1.packed == r2.packed
        seed_effect = r1.packed != r3.packed
        bad = bool(off.any()) or not s_ok.all() or not sdec_ok or cv["mism"] or not determinism or not seed_effect \
            or abs(z) > 6
        for k in np.argwhere(off)[: self.examples]:
            k = tuple(k)
            details.append("[%d,%d] t=%s allowed q=%g|%g keel q=%g" % (k[0], k[1], hexf(t[k]), lo_q[k], hi_q[k], q[k]))
        if not sdec_ok:
            details.append("S_dec: ref=%s keel=%s" % (hexf(ref["s_dec"]), hexf(s_dec)))
        if cv["mism"]:
            details.append("keel --out differs from (q*sf)*S_dec of its own codes at %d elements" % cv["mism"])
        fields = ff + ["off_grid=%d" % int(off.sum()), "z=%.2f" % z, "deterministic=%s" % ("yes" if determinism else "NO"),
                       "seed_changes_output=%s" % ("yes" if seed_effect else "NO"),
                       "scales_mism=%d" % int((~s_ok).sum()), "s_dec=%s" % ("ok" if sdec_ok else "BAD"),
                       "out_vs_codes_mism=%d" % cv["mism"]]
        return ("FAIL" if bad else "PASS", fields, details if (bad or self.args.verbose) else ())


# ----------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------
def run_mx(h, args, devices):
    blocks = [32] if args.quick else [32, 16]
    axes = [1, 0]
    for fmt in MX_FORMATS:
        if args.formats and fmt not in args.formats:
            continue
        elem = sm.MX_FORMATS[fmt]
        for block in blocks:
            case_list = cases.mx_cases(elem, block, args.quick)
            for name, a in case_list:
                if args.case and not any(c in name for c in args.case):
                    continue
                for axis in axes:
                    x = a if axis == 1 else np.ascontiguousarray(a.T)
                    for rounding in MX_ROUNDINGS:
                        h.mx_case(name, x, fmt, rounding, axis, block, devices)
            if not args.no_sr and (not args.case or any("sr" in c for c in args.case)):
                for axis in (axes if not args.quick else [1]):
                    h.mx_sr_case(fmt, axis, block, devices)


def run_nvfp4(h, args, devices):
    if args.formats and "nvfp4" not in args.formats:
        return
    for tile16 in [False, True]:
        for rht in [False, True]:
            for name, a, required in cases.nvfp4_cases(tile16, rht, args.quick):
                if args.case and not any(c in name for c in args.case):
                    continue
                for axis in [1, 0]:
                    x = a if axis == 1 else np.ascontiguousarray(a.T)
                    h.nvfp4_case(name, x, tile16, rht, axis, required, devices)
            if not args.no_sr and (not args.case or any("sr" in c for c in args.case)):
                for axis in ([1, 0] if not args.quick else [1]):
                    h.nvfp4_sr_case(tile16, rht, axis, devices)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keel-quant", help="path to keel-quant (or a command line, shell-quoted)")
    ap.add_argument("--refs", default=None, help="directory holding microxcaling/ and te/ (default: <repo>/.refs)")
    ap.add_argument("--quick", action="store_true", help="fewer cases (block 32 only, fewer scales)")
    ap.add_argument("--self-test", action="store_true",
                    help="no keel-quant: check the generators, the references, and run the harness against "
                         "(a) the references themselves (must all PASS) and (b) our exact model of "
                         "docs/numerics.md (its FAILs are spec-vs-reference discrepancies)")
    ap.add_argument("--device", default="cpu", help="keel-quant --device values to test, comma-separated "
                                                    "(cpu,cuda also checks that both agree bit for bit)")
    ap.add_argument("--ref-device", default="cpu", help="torch device for the references (cpu or cuda)")
    ap.add_argument("--only", choices=["mx", "nvfp4"], help="run one half only")
    ap.add_argument("--formats", nargs="*", help="keel format names to run (default all)")
    ap.add_argument("--case", nargs="*", help="substrings of case names to run (sr = stochastic checks)")
    ap.add_argument("--no-sr", action="store_true", help="skip the stochastic-rounding property checks")
    ap.add_argument("--strict-zero-sign", action="store_true", help="count +0/-0 differences as failures")
    ap.add_argument("--examples", type=int, default=4, help="example values printed per failing case")
    ap.add_argument("--verbose", action="store_true", help="print details for passing cases too")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per keel-quant call")
    ap.add_argument("--emulate-fp8", action="store_true",
                    help="torch < 2.1 only: emulate torch.float8_e4m3fn (RNE) so the TE reference can run; "
                         "results are labelled EMULATED and are not a substitute for torch >= 2.1")
    args = ap.parse_args(argv)

    repo = os.path.dirname(os.path.dirname(HERE))
    refs_dir = args.refs or os.path.join(repo, ".refs")
    if not os.path.isabs(refs_dir) and not os.path.isdir(refs_dir):
        refs_dir = os.path.join(repo, refs_dir)
    if torch is None:
        print("refcheck: error: torch is not importable by %s; install torch (Debian: apt-get install "
              "python3-torch python3-numpy, then run with /usr/bin/python3)" % sys.executable, file=sys.stderr)
        return 2
    print("refcheck: python %s, torch %s, numpy %s, refs %s" % (sys.version.split()[0], torch.__version__,
                                                                 np.__version__, refs_dir))
    if args.ref_device == "cuda" and not torch.cuda.is_available():
        print("refcheck: error: --ref-device cuda but torch sees no GPU", file=sys.stderr)
        return 2
    try:
        mx_ref = refs.MxReference(refs_dir, args.ref_device)
    except Exception as e:  # noqa: BLE001
        print("refcheck: error: cannot load microxcaling: %s" % e, file=sys.stderr)
        return 2
    nv_ref, nv_why = None, ""
    if args.emulate_fp8 and not hasattr(torch, "float8_e4m3fn"):
        refs.emulate_fp8()
        print("refcheck: WARNING: torch.float8_e4m3fn EMULATED (torch %s): NVFP4 results below are from TE's "
              "reference with an emulated E4M3 cast" % torch.__version__)
    try:
        nv_ref = refs.Nvfp4Reference(refs_dir, args.ref_device)
    except Exception as e:  # noqa: BLE001
        nv_why = str(e)

    if args.self_test:
        import selftest
        return selftest.run(args, mx_ref, nv_ref, nv_why)

    if not args.keel_quant:
        ap.error("--keel-quant PATH is required (or --self-test)")
    cmd = shlex.split(args.keel_quant)
    if len(cmd) == 1 and not os.path.exists(cmd[0]):
        print("refcheck: error: %s does not exist" % cmd[0], file=sys.stderr)
        return 2
    devices = [d.strip() for d in args.device.split(",") if d.strip()]
    tally = Tally()
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="refcheck.") as tmp:
        runner = KeelRunner(cmd, tmp, args.timeout)
        h = Harness(args, runner, mx_ref, nv_ref, tally)
        if args.only in (None, "mx"):
            run_mx(h, args, devices)
        if args.only in (None, "nvfp4"):
            if nv_ref is None:
                print("SKIP nvfp4: TE reference unavailable: %s" % nv_why, flush=True)
                tally.skipped += 1
            else:
                run_nvfp4(h, args, devices)
    summarize(tally, time.time() - t0)
    return 1 if tally.failed else 0


def summarize(tally, secs):
    print("\nrefcheck: %d PASS, %d FAIL, %d SKIP (%.0fs)" % (tally.passed, tally.failed, tally.skipped, secs))
    if tally.zsign_lines:
        print("refcheck: %d cases differ only-or-also in the sign of zeros (+0 vs -0; not failures unless "
              "--strict-zero-sign):" % len(tally.zsign_lines))
        for line in tally.zsign_lines[:40]:
            print("  " + line)
        if len(tally.zsign_lines) > 40:
            print("  ... %d more" % (len(tally.zsign_lines) - 40))
    if tally.failed:
        print("refcheck: failing cases:")
        for line in tally.fail_lines:
            print("  " + line.splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())
