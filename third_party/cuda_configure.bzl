"""Detects a local CUDA toolkit and describes it to the build.

Writes @local_cuda//:defs.bzl with HAS_CUDA, NVCC and NVCC_ARCH_FLAGS, and
@local_cuda//:cudart, :cublaslt and :nccl (link options for the CUDA runtime,
cuBLASLt and NCCL, which the toolkit's lib64 holds; nvcc finds their headers in
its own include directory). Without a toolkit (or with KEEL_CUDA=0 in the
environment) HAS_CUDA is False and every CUDA target is replaced by a stub that
reports "built without CUDA".
"""

def _cuda_configure_impl(ctx):
    cuda_path = ctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    wanted = ctx.os.environ.get("KEEL_CUDA", "auto")
    nvcc = cuda_path + "/bin/nvcc"
    has_cuda = wanted != "0" and ctx.path(nvcc).exists
    arch_flags = []
    if has_cuda:
        listed = ctx.execute([nvcc, "--list-gpu-arch"])
        archs = listed.stdout.replace("\n", " ").split(" ")
        for arch in ["90", "100"]:
            if "compute_" + arch in archs:
                # "a" targets unlock the architecture-specific instructions.
                arch_flags.append("-gencode=arch=compute_%sa,code=sm_%sa" % (arch, arch))
        if not arch_flags:
            has_cuda = False
    if has_cuda:
        print("Keel: CUDA found at %s; building CUDA targets for %s" % (cuda_path, " ".join(arch_flags)))
        link = ["-L%s/lib64" % cuda_path, "-lcudart_static", "-ldl", "-lrt", "-lpthread"]
        blaslt = ["-L%s/lib64" % cuda_path, "-lcublasLt", "-lcublas"]
        nccl = ["-L%s/lib64" % cuda_path, "-lnccl"]
    else:
        print("Keel: no CUDA toolkit (looked for %s, KEEL_CUDA=%s); building without CUDA targets" % (nvcc, wanted))
        link = []
        blaslt = []
        nccl = []
    ctx.file("defs.bzl", "\n".join([
        "HAS_CUDA = %s" % has_cuda,
        "CUDA_PATH = %r" % cuda_path,
        "NVCC = %r" % nvcc,
        "NVCC_ARCH_FLAGS = %r" % arch_flags,
        "",
    ]))
    ctx.file("BUILD", "\n".join([
        'package(default_visibility = ["//visibility:public"])',
        'exports_files(["defs.bzl"])',
        "cc_library(name = \"cudart\", linkopts = %r)" % link,
        "cc_library(name = \"cublaslt\", linkopts = %r)" % blaslt,
        "cc_library(name = \"nccl\", linkopts = %r)" % nccl,
        "",
    ]))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_PATH", "KEEL_CUDA"],
    local = True,
)
