"""Adapters around the upstream references kept in .refs/ (see README.md).

MxReference   : microxcaling's quantize_mx_op (pure-PyTorch path, custom_cuda=False)
Nvfp4Reference: TransformerEngine's NVFP4QuantizerRef (pure PyTorch)

Both return everything in keel's layout conventions (kernels/quantize.h):
dequantized values (rows, cols) float32, element codes (rows, cols) one per
byte, block scales (axis 1: rows x nblocks, axis 0: nblocks x cols), and for
NVFP4 the per-tensor decode scale.

Where the reference exposes only dequantized values (microxcaling), the scale
bytes are taken from the reference's own shared-exponent function on the same
tensor and device (so they are exactly what the reference used), and the codes
are the reference's dequantized values divided by 2^e (exact), encoded.
"""

import os
import sys

import numpy as np

import spec_model as sm

try:
    import torch
except ImportError:  # reported by refcheck.py
    torch = None


MS_ROUND = {"nearest_even": "even", "nearest_away": "nearest", "floor": "floor"}


def torch_version_tuple():
    if torch is None:
        return (0, 0)
    parts = torch.__version__.split("+")[0].split(".")
    out = []
    for p in parts[:2]:
        digits = "".join(ch for ch in p if ch.isdigit())
        out.append(int(digits or 0))
    return tuple(out)


class MxReference:
    def __init__(self, refs_dir, device="cpu"):
        if torch is None:
            raise RuntimeError("torch is not importable")
        path = os.path.join(os.path.abspath(refs_dir), "microxcaling")
        if not os.path.isfile(os.path.join(path, "mx", "mx_ops.py")):
            raise RuntimeError("microxcaling not found under %s (run tests/refcheck/setup_refs.sh)" % path)
        if path not in sys.path:
            sys.path.insert(0, path)
        # mx/ is used as a namespace package (no __init__.py copied): its
        # upstream __init__ imports every layer of the library.
        import importlib
        self.mo = importlib.import_module("mx.mx_ops")
        self.device = device
        self.specs = {
            "scale_bits": 8,
            "shared_exp_method": "max",
            "mx_flush_fp32_subnorms": False,
            "custom_cuda": False,
            "block_size": 32,
        }

    def _tensor(self, x):
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32).copy()).to(self.device)

    def shared_exponents(self, x, elem, block, axis):
        """The block exponents e quantize_mx_op uses (float, NaN for NaN
        blocks), in keel's scale layout. Calls the reference's own
        _reshape_to_blocks and _shared_exponents, then the same offset/clamp
        lines as _quantize_mx."""
        mo = self.mo
        emax = sm.FORMATS[elem].emax
        A = self._tensor(x)
        Ab, axes, _, _ = mo._reshape_to_blocks(A, [axis], block)
        sexp = mo._shared_exponents(Ab, method="max", axes=[a + 1 for a in axes], ebits=0)
        sexp = sexp - emax
        sexp[sexp > 127] = float("NaN")
        sexp[sexp < -127] = -127
        e = sexp.squeeze(axes[0] + 1).cpu().numpy().astype(np.float64)
        # axis 1: (rows, nblocks); axis 0: (nblocks, cols). Both are keel's layout.
        return e

    def quantize(self, x, elem, block, axis, rounding):
        """Returns dict(out, codes, scales, nan_mask, e_elem)."""
        fmt = sm.FORMATS[elem]
        A = self._tensor(x)
        out = self.mo.quantize_mx_op(A, self.specs, elem_format=fmt.ms_name, block_size=block,
                                     axes=[axis], round=MS_ROUND[rounding])
        out = out.cpu().numpy().astype(np.float32)
        e = self.shared_exponents(x, elem, block, axis)
        rows, cols = x.shape
        if axis == 1:
            e_elem = np.repeat(e, block, axis=1)[:, :cols]
        else:
            e_elem = np.repeat(e, block, axis=0)[:rows, :]
        nan_mask = np.isnan(e_elem)
        scales = np.where(np.isnan(e), 0xFF, np.nan_to_num(e) + 127).astype(np.uint8)
        r = out.astype(np.float64) * np.ldexp(1.0, -np.nan_to_num(e_elem).astype(np.int64))
        r_enc = np.where(nan_mask | ~np.isfinite(r), 0.0, r)
        try:
            codes = fmt.encode(r_enc)
            code_note = ""
        except ValueError as err:  # should not happen; reported, not fatal
            codes = np.zeros(x.shape, np.uint8)
            code_note = str(err)
        # Elements the reference returns as +-Inf in a non-NaN block (it can:
        # see README) have no code; they are masked out of the code check.
        code_mask = nan_mask | ~np.isfinite(r)
        return dict(out=out, codes=codes, scales=scales, nan_mask=nan_mask, code_mask=code_mask,
                    e_elem=e_elem, code_note=code_note)


FP4_LUT = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                    -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32)


_FP8_EMULATED = False


def emulate_fp8():
    """For torch < 2.1 only (no torch.float8_e4m3fn): installs a stand-in
    dtype whose Tensor.to() rounds to E4M3 (RNE, our spec_model) and returns
    float32. This is NOT the reference's own cast; it exists so that the TE
    reference's plumbing and the harness can be exercised on an old torch.
    Results produced with it are labelled EMULATED."""
    global _FP8_EMULATED
    if hasattr(torch, "float8_e4m3fn") or _FP8_EMULATED:
        return
    sentinel = type("EmulatedFloat8E4M3", (), {"__repr__": lambda self: "emulated_float8_e4m3fn"})()
    orig_to = torch.Tensor.to

    def to(self, *a, **k):
        if (a and a[0] is sentinel) or k.get("dtype") is sentinel:
            v = self.detach().to(torch.float32).cpu().numpy()
            r, _ = sm.e4m3_rne(v)
            return torch.from_numpy(np.ascontiguousarray(r)).to(self.device)
        return orig_to(self, *a, **k)

    torch.Tensor.to = to
    torch.float8_e4m3fn = sentinel
    _FP8_EMULATED = True


def fp8_emulated():
    return _FP8_EMULATED


class Nvfp4Reference:
    def __init__(self, refs_dir, device="cpu"):
        if torch is None:
            raise RuntimeError("torch is not importable")
        if not hasattr(torch, "float8_e4m3fn"):
            raise RuntimeError(
                "TE's NVFP4 reference needs torch >= 2.1 (torch.float8_e4m3fn); this torch is %s"
                % torch.__version__)
        te_dir = os.path.join(os.path.abspath(refs_dir), "te")
        if not os.path.isfile(os.path.join(te_dir, "reference_nvfp4.py")):
            raise RuntimeError("TE reference not found under %s (run tests/refcheck/setup_refs.sh)" % te_dir)
        if str(device).startswith("cuda"):
            # TE's RHT is a torch matmul: keep it in true fp32 (no TF32).
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            if hasattr(torch, "set_float32_matmul_precision"):
                torch.set_float32_matmul_precision("highest")
        here = os.path.dirname(os.path.abspath(__file__))
        if here not in sys.path:
            sys.path.insert(0, here)
        import te_shims
        self.ref = te_shims.load_te_reference(te_dir)
        self.device = device

    def _quantizer(self, tile16x16, rht):
        ref = self.ref
        import transformer_engine.pytorch.custom_recipes.reference_utils as ru
        return ref.NVFP4QuantizerRef(
            dtype=ru.Fp4Formats.E2M1, rowwise=False, columnwise=True, pow_2_scales=False,
            eps=0.0, quant_tile_shape=(16, 16) if tile16x16 else (1, 16),
            with_rht=rht, with_random_sign_mask=True)

    def rotate(self, x, axis):
        """TE's own _apply_rht along keel's axis (float32 numpy in, out)."""
        q = self._quantizer(False, True)
        z = np.ascontiguousarray(x if axis == 1 else x.T, dtype=np.float32)
        y = q._apply_rht(torch.from_numpy(z.copy()).to(self.device)).cpu().numpy()
        return np.ascontiguousarray(y if axis == 1 else y.T)

    def quantize(self, x, tile16x16=False, rht=False, axis=1):
        """Quantizes along keel's axis. The reference quantizes the rows of its
        'columnwise' input (tensor.t(), rotated when with_rht), so it is fed
        z.T where z = x (axis 1) or x.T (axis 0): its columnwise path then
        quantizes (and rotates) exactly the rows of z."""
        q = self._quantizer(tile16x16, rht)
        z = np.ascontiguousarray(x if axis == 1 else x.T, dtype=np.float32)
        rz, cz = z.shape
        t_in = torch.from_numpy(np.ascontiguousarray(z.T).copy()).to(self.device)
        res = q.quantize(t_in)
        data_t = res.data_t.view(torch.uint8).cpu().numpy()          # (rz, cz/2)
        scale_t = res.scale_t[:rz]                                      # (rz, ceil(cz/16)) e4m3
        amax = res.global_amax_col.to(torch.float32)
        # S_dec exactly as _quantize_blockwise_reference computes global_decode_scale.
        dev = t_in.device
        gec = torch.div(torch.tensor(448.0, device=dev) * torch.tensor(6.0, device=dev), amax)
        gec = torch.min(gec, torch.tensor(torch.finfo(torch.float32).max, device=dev, dtype=torch.float32))
        if gec.numel() == 1 and gec == torch.tensor(0.0, device=dev):
            gec = torch.tensor(1.0, device=dev, dtype=torch.float32)
        gdc = torch.div(1.0, gec)
        codes_z = np.empty((rz, data_t.shape[1] * 2), np.uint8)
        codes_z[:, 0::2] = data_t & 0xF
        codes_z[:, 1::2] = data_t >> 4
        codes_z = codes_z[:, :cz]
        sf = scale_t.to(torch.float32)
        # Dequantized value = (q * float(sf)) * S_dec, fp32 (docs/numerics.md, "NVFP4", step 5;
        # the reference itself has no dequantize for NVFP4).
        qv = torch.from_numpy(FP4_LUT[codes_z]).to(dev)
        sf_elem = torch.repeat_interleave(sf, 16, dim=1)[:, :cz]
        out_z = ((qv * sf_elem) * gdc).cpu().numpy().astype(np.float32)
        # t = clamp(x * s_b, -6, 6) with the reference's scales (for stochastic checks)
        zin = torch.from_numpy(z.copy()).to(dev)
        if rht:
            zin = q._apply_rht(zin)
        fmax = torch.tensor(torch.finfo(torch.float32).max, device=dev, dtype=torch.float32)
        s_b = torch.min(torch.div(1.0, sf_elem * gdc), fmax)
        t_z = torch.clamp(zin.to(torch.float32) * s_b, -6.0, 6.0).cpu().numpy()
        # E4M3 bytes from the scale values (exact E4M3 values; NaN -> 0x7F):
        # the same bytes as scale_t.view(torch.uint8), without needing the
        # float8 dtype's storage (see emulate_fp8 below).
        sfn = sf.cpu().numpy()
        scales_z = sm.FORMATS["e4m3"].encode(np.where(np.isnan(sfn), 0.0, sfn).astype(np.float64))
        scales_z = np.where(np.isnan(sfn), np.uint8(0x7F), scales_z).astype(np.uint8)

        def back(a):
            return np.ascontiguousarray(a if axis == 1 else a.T)

        return dict(out=back(out_z), codes=back(codes_z), scales=back(scales_z),
                    s_dec=np.float32(gdc.reshape(-1)[0].item()), t=back(t_z),
                    amax=np.float32(amax.reshape(-1)[0].item()))
