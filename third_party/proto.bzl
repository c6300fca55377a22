"""cc_proto_library for Bazel 4 without downloaded rules: runs Debian's protoc (and
grpc_cpp_plugin for services) from a genrule and wraps the generated C++ in a
cc_library linked against the system protobuf / gRPC libraries."""

def keel_cc_proto_library(name, src, grpc = False, deps = [], visibility = None):
    """name: the cc_library; src: one .proto file in this package.

    Generates <base>.pb.{h,cc} (and <base>.grpc.pb.{h,cc} with grpc = True), with
    include paths relative to the workspace root (#include "proto/keel.pb.h").
    """
    base = src[:-len(".proto")]
    pkg = native.package_name()
    outs = [base + ".pb.h", base + ".pb.cc"]
    cmd = "protoc -I. --cpp_out=$(GENDIR) "
    if grpc:
        outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
        cmd += "--grpc_out=$(GENDIR) --plugin=protoc-gen-grpc=$$(command -v grpc_cpp_plugin) "
    cmd += pkg + "/" + src
    native.genrule(
        name = name + "_gen",
        srcs = [src],
        outs = outs,
        cmd = cmd,
        message = "protoc " + src,
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + ["@system//:grpcpp" if grpc else "@system//:protobuf"],
        visibility = visibility,
    )
