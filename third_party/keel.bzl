"""keel_library and keel_test: Keel's C++ targets without the boilerplate.

Most of Keel's targets follow one pattern: a library `foo` is foo.cc and foo.h, a
test `foo_test` is foo_test.cc linked with GoogleTest's main. These macros fill in
that pattern, so a BUILD file says only what differs: the deps and anything
unusual (data, tags, linkopts, visibility, other sources). Every other keyword
goes to cc_library / cc_test unchanged.
"""

load("@rules_cc//cc:defs.bzl", "cc_binary", "cc_library", "cc_test")

def _set_if_given(attrs, key, value):
    # An empty list is left out rather than passed, so that the target reads
    # exactly like one written without the attribute (bazel query shows no
    # `data = []`).
    if value:
        attrs[key] = value

def keel_library(name, deps = [], srcs = None, hdrs = None, **kwargs):
    """A cc_library of name.cc and name.h unless srcs / hdrs say otherwise.

    A header-only library passes srcs = [].
    """
    attrs = dict(kwargs)
    _set_if_given(attrs, "srcs", [name + ".cc"] if srcs == None else srcs)
    _set_if_given(attrs, "hdrs", [name + ".h"] if hdrs == None else hdrs)
    _set_if_given(attrs, "deps", deps)
    cc_library(name = name, **attrs)

def keel_test(name, deps = [], size = "small", srcs = None, data = [], **kwargs):
    """A cc_test of name.cc (unless srcs says otherwise) with GoogleTest's main."""
    attrs = dict(kwargs)
    _set_if_given(attrs, "srcs", [name + ".cc"] if srcs == None else srcs)
    _set_if_given(attrs, "data", data)
    cc_test(
        name = name,
        size = size,
        deps = deps + ["@system//:gtest_main"],
        **attrs
    )

def keel_binary(name, srcs = None, **kwargs):
    """A cc_binary of its own source file: name.cc, with dashes read as
    underscores (keel-quant is keel_quant.cc), unless srcs says otherwise."""
    attrs = dict(kwargs)
    _set_if_given(attrs, "srcs", [name.replace("-", "_") + ".cc"] if srcs == None else srcs)
    cc_binary(name = name, **attrs)
