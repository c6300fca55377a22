"""Minimal stand-ins for the TransformerEngine internals that TE's pure-PyTorch
NVFP4 reference (transformer_engine/pytorch/custom_recipes/reference_nvfp4.py)
imports, so that the unmodified upstream file, copied to .refs/te/, can be
imported without building TE.

Written by us. Only what reference_nvfp4.py touches at import time and on the
quantize() path is provided:
  - transformer_engine.pytorch.quantized_tensor.Quantizer: the base class; its
    __init__(*, rowwise, columnwise) sets rowwise_usage / columnwise_usage /
    internal / optimize_for_gemm like TE's does. NVFP4QuantizerRef overrides
    quantize(), so nothing else of the base class is used.
  - transformer_engine.pytorch.quantized_tensor.QuantizedTensorStorage: an
    empty base class (NVFP4TensorRef is a dataclass deriving from it).
  - transformer_engine.pytorch.custom_recipes.gemm: GEMMType (evaluated in a
    default argument of qgemm) and MMParams (an annotation). qgemm is never
    called by refcheck.
  - transformer_engine.pytorch.custom_recipes.reference_utils: the upstream
    file itself (pure torch), loaded from .refs/te/reference_utils.py.
"""

import dataclasses
import enum
import importlib.util
import os
import sys
import types


def _module(name):
    mod = sys.modules.get(name)
    if mod is None:
        mod = types.ModuleType(name)
        mod.__path__ = []  # mark as a package so submodules can hang off it
        sys.modules[name] = mod
    return mod


class Quantizer:
    """Stand-in for transformer_engine.pytorch.quantized_tensor.Quantizer."""

    def __init__(self, *, rowwise, columnwise):
        self.rowwise_usage = rowwise
        self.columnwise_usage = columnwise
        self.internal = False
        self.optimize_for_gemm = False


class QuantizedTensorStorage:
    """Stand-in for transformer_engine.pytorch.quantized_tensor.QuantizedTensorStorage."""


class GEMMType(enum.Enum):
    FPROP = "fprop"
    DGRAD = "dgrad"
    WGRAD = "wgrad"


@dataclasses.dataclass
class MMParams:
    out_dtype: object = None
    use_split_accumulator: bool = False


def load_te_reference(te_dir):
    """Installs the shims and imports te_dir/reference_nvfp4.py. Returns the
    module. te_dir must also hold reference_utils.py (upstream, unmodified)."""
    _module("transformer_engine")
    _module("transformer_engine.pytorch")
    recipes = _module("transformer_engine.pytorch.custom_recipes")

    qt = _module("transformer_engine.pytorch.quantized_tensor")
    qt.Quantizer = Quantizer
    qt.QuantizedTensorStorage = QuantizedTensorStorage
    sys.modules["transformer_engine.pytorch"].quantized_tensor = qt

    gemm = _module("transformer_engine.pytorch.custom_recipes.gemm")
    gemm.GEMMType = GEMMType
    gemm.MMParams = MMParams
    recipes.gemm = gemm

    def load(name, path):
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        return mod

    recipes.reference_utils = load("transformer_engine.pytorch.custom_recipes.reference_utils",
                                   os.path.join(te_dir, "reference_utils.py"))
    ref = load("transformer_engine.pytorch.custom_recipes.reference_nvfp4",
               os.path.join(te_dir, "reference_nvfp4.py"))
    recipes.reference_nvfp4 = ref
    return ref
