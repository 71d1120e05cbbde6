"""compat.pipeline_compiler_options: a schedule's programs get XLA's default emitters back only
where the process chose the older ones itself (jax 0.10's CPU); nowhere else an option."""

from jaxscale import compat


def test_the_option_follows_the_processs_own_emitter_choice(monkeypatch):
    fast = compat.fast_compile_xla_flags()
    monkeypatch.setenv("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 {fast}".strip())
    want = {"xla_cpu_use_fusion_emitters": True} if fast else {}
    assert compat.pipeline_compiler_options() == want
    # the user's own emitter choice, or no choice at all: nothing is overridden
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_fusion_emitters=true")
    assert compat.pipeline_compiler_options() == {}
    monkeypatch.delenv("XLA_FLAGS")
    assert compat.pipeline_compiler_options() == {}
