"""Pinning loom and PyTorch to one x86-64 instruction-set level on any machine, so that an
AVX-512 machine measures what an AVX2-only one (e.g. AMD Zen 3) would, both sides alike
(bench/README.md "Pinned levels"):

  loom     LOOM_ISA (its kernels' level, docs/build.md), ONEDNN_MAX_CPU_ISA (its linear
           layers' oneDNN GEMMs), OPENBLAS_CORETYPE (OpenBLAS's kernels)
  PyTorch  ATEN_CPU_CAPABILITY (ATen's vectorized kernels, SDPA's included),
           MKL_ENABLE_INSTRUCTIONS (MKL's GEMMs), ONEDNN_MAX_CPU_ISA (its oneDNN)

What each side then used is read back, not assumed: loom_isa_name(loom_isa_active()) and
torch.backends.cpu.get_cpu_capability(); check_used() refuses a run where either differs."""
import subprocess

LEVELS = ("avx512", "avx2")  # the levels a benchmark pins to, best first
_ENV = {
    "avx512": {"LOOM_ISA": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
               "OPENBLAS_CORETYPE": "SkylakeX", "ATEN_CPU_CAPABILITY": "avx512",
               "MKL_ENABLE_INSTRUCTIONS": "AVX512"},
    "avx2": {"LOOM_ISA": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "OPENBLAS_CORETYPE": "Haswell",
             "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
}
_TORCH_NAME = {"avx512": "AVX512", "avx2": "AVX2"}  # get_cpu_capability()'s words


def level_env(level):
    """the environment variables that pin both sides to `level`"""
    return dict(_ENV[level])


def machine_levels(loom_bin):
    """the pinnable levels this CPU runs, best first, from `loom version` ('... this CPU
    supports up to avx512')"""
    out = subprocess.run([loom_bin, "version"], capture_output=True, text=True,
                         check=True).stdout
    top = out.split("supports up to ")[-1].split(")")[0].strip()
    return list(LEVELS[LEVELS.index(top):]) if top in LEVELS else []


def used(lib=None):
    """{'loom': level name, 'torch': capability} as each side reports it in this process
    (lib: loomlib's handle, None to leave loom out; torch is imported only if already
    loaded)"""
    import sys
    res = {}
    if lib is not None:
        res["loom"] = lib.loom_isa_name(lib.loom_isa_active()).decode()
    if "torch" in sys.modules:
        res["torch"] = sys.modules["torch"].backends.cpu.get_cpu_capability()
    return res


def check_used(level, rep, what):
    """None if the reported levels `rep` (used()) match `level`, else the error message"""
    bad = []
    if "loom" in rep and rep["loom"] != level:
        bad.append(f"loom ran its {rep['loom']} kernels")
    if "torch" in rep and rep["torch"] != _TORCH_NAME[level]:
        bad.append(f"PyTorch reports {rep['torch']}")
    return f"{what}: pinned to {level} but {', '.join(bad)}" if bad else None
