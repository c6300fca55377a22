"""cuda_library: compiles .cu files with nvcc from a genrule into a static library.

Bazel 4 has no CUDA rules; this macro runs nvcc on each .cu file (one object per
file, so a change recompiles one unit) and wraps the objects in a cc_library.
When the toolkit is missing, `fallback_srcs` (plain C++) are used instead.
"""

load("@local_cuda//:defs.bzl", "HAS_CUDA", "NVCC", "NVCC_ARCH_FLAGS")

# -fmad=false: the kernels must round exactly like the CPU reference, so no
# contraction of a*b+c into one fused multiply-add.
_NVCC_FLAGS = [
    "-std=c++17",
    "-O3",
    "-fmad=false",
    "--expt-relaxed-constexpr",
    "-Xcompiler=-fPIC",
    "-I.",
] + NVCC_ARCH_FLAGS

# nvcc_hdrs: headers of other packages that the .cu files include (labels such as
# "//kernels:quant_core.h"), so that the nvcc action sees them and reruns when they
# change; headers of this package are seen already (hdrs and every *.h here), and
# so is the base package (//kernels/base), which any .cu file may include.
def cuda_library(name, srcs, hdrs = [], deps = [], fallback_srcs = [], nvcc_hdrs = [], visibility = None, **kwargs):
    if not HAS_CUDA:
        native.cc_library(
            name = name,
            srcs = fallback_srcs,
            hdrs = hdrs,
            deps = deps,
            visibility = visibility,
            **kwargs
        )
        return
    local_hdrs = hdrs + [h for h in native.glob(["*.h"]) if h not in hdrs]
    objs = []
    for src in srcs:
        obj = src.replace(".cu", ".cu.o")
        rule_name = name + "_" + src.replace("/", "_").replace(".", "_")
        native.genrule(
            name = rule_name,
            srcs = [src] + local_hdrs + nvcc_hdrs + ["//kernels/base:nvcc_headers"],
            outs = [obj],
            cmd = "%s %s -c $(location %s) -o $@" % (NVCC, " ".join(_NVCC_FLAGS), src),
            message = "nvcc " + src,
            tags = kwargs.get("tags", []),
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cudart"],
        linkstatic = True,
        visibility = visibility,
        **kwargs
    )
