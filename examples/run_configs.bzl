"""The run configs in examples/, for the tests that read every one of them."""

RUN_CONFIGS = [
    "//examples:gpt2_124m.yaml",
    "//examples:gla_124m.yaml",
    "//examples:gla_fortunes_cpu.yaml",
    "//examples:gpt_fortunes_cpu.yaml",
    "//examples:llama_124m.yaml",
    "//examples:llama_fortunes_cpu.yaml",
    "//examples:proxy_cpu.yaml",
    "//examples:proxy_mxfp8_e4m3.yaml",
    "//examples:proxy_mxfp8_e4m3_policy.yaml",
    "//examples:proxy_mxfp8_e4m3_policy_default.yaml",
    "//examples:proxy_mxfp8_e4m3_policy_tuned.yaml",
]
