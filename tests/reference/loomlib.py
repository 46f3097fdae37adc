"""ctypes access to libloom for the Python reference tests.

    from loomlib import lib, fptr, iptr, f32
    L = lib()                       # LOOM_LIB, else <repo>/build/libloom.so
    x = f32(np.random.randn(4, 8))  # C-contiguous float32 copy
    L.gelu_forward(fptr(y), fptr(x), x.size)

Every kernel of include/loom/kernels.h has its argtypes declared here, so a wrong count or a
Python float where an int is expected fails loudly instead of corrupting memory. fptr/iptr
accept None (-> NULL) and refuse arrays of the wrong dtype or layout.
"""
import ctypes
import os
import sys

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(_HERE))

_P = ctypes.c_void_p
_I = ctypes.c_int
_L = ctypes.c_int64
_F = ctypes.c_float



class AttnDims(ctypes.Structure):
    """loom_attn_dims (include/loom/kernels.h)"""
    _fields_ = [(n, ctypes.c_int) for n in ("B", "Tq", "Tk", "H", "KVH", "D")] + \
               [(n, ctypes.c_int64) for n in ("q_bs", "q_ts", "k_bs", "k_ts", "v_bs", "v_ts",
                                              "o_bs", "o_ts")]


class AttnMask(ctypes.Structure):
    """loom_attn_mask (include/loom/kernels.h)"""
    _fields_ = [("causal", ctypes.c_int), ("q_pos0", ctypes.c_int64), ("k_pos0", ctypes.c_int64),
                ("q_doc", ctypes.c_void_p), ("k_doc", ctypes.c_void_p),
                ("q_doc_bs", ctypes.c_int64), ("k_doc_bs", ctypes.c_int64),
                ("window", ctypes.c_int64), ("scale", ctypes.c_float), ("softcap", ctypes.c_float)]


(ATTN_ISA_AUTO, ATTN_ISA_PORTABLE, ATTN_ISA_AVX512, ATTN_ISA_AVX512_BLAS, ATTN_ISA_AVX2,
 ATTN_ISA_AVX2_C) = 0, 1, 2, 3, 4, 5
_DP = ctypes.POINTER(AttnDims)
_MP = ctypes.POINTER(AttnMask)

# name -> (restype, argtypes); mirrors include/loom/kernels.h
KERNELS = {
    "matmul_forward": (None, [_P, _P, _P, _P, _L, _I, _I]),
    "matmul_backward": (None, [_P, _P, _P, _P, _P, _P, _L, _I, _I]),
    "layernorm_forward": (None, [_P, _P, _P, _P, _P, _P, _L, _I, _F]),
    "layernorm_backward": (None, [_P, _P, _P, _P, _P, _P, _P, _P, _L, _I]),
    "rmsnorm_forward": (None, [_P, _P, _P, _P, _L, _I, _F]),
    "rmsnorm_backward": (None, [_P, _P, _P, _P, _P, _P, _L, _I]),
    "gelu_forward": (None, [_P, _P, _L]),
    "gelu_backward": (None, [_P, _P, _P, _L]),
    "swiglu_forward": (None, [_P, _P, _L, _I]),
    "swiglu_backward": (None, [_P, _P, _P, _L, _I]),
    "geglu_forward": (None, [_P, _P, _L, _I]),
    "geglu_backward": (None, [_P, _P, _P, _L, _I]),
    "softcap_forward": (None, [_P, _L, _F]),
    "rownorm_sums": (None, [_P, _L, _P, _P, _P, _P, _L, _I, _L]),
    "rownorm_forward": (None, [_P, _P, _P, _P, _P, _L, _I, _L, _L, _I, _F]),
    "rownorm_backward": (None, [_P, _P, _P, _P, _P, _P, _P, _L, _I, _L, _L, _I]),
    "rope_tables": (None, [_P, _P, _I, _I, _F]),
    "rope_forward": (None, [_P, _L, _I, _I, _I, _L, _P, _P, _I]),
    "rope_backward": (None, [_P, _L, _I, _I, _I, _L, _P, _P, _I]),
    "attention_forward": (None, [_P, _P, _P, _I, _I, _I, _I, _I, _MP]),
    "attention_backward": (None, [_P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _MP]),
    "flash_attention_dims_qkv": (AttnDims, [_I, _I, _I, _I, _I]),
    "flash_attention_forward": (_I, [_P, _P, _P, _P, _P, _DP, _MP, _I]),
    "flash_attention_backward": (_I, [_P, _P, _P, _P, _P, _P, _P, _P, _P, _DP, _MP, _I]),
    "flash_attention_have_avx512": (_I, []),
    "embedding_forward": (None, [_P, _P, _P, _P, _I, _I, _I, _I]),
    "embedding_backward": (None, [_P, _P, _P, _P, _I, _I, _I, _I]),
    "residual_forward": (None, [_P, _P, _P, _L]),
    "crossentropy_forward": (None, [_P, _P, _P, _L, _I]),
    "crossentropy_softmax_backward": (None, [_P, _P, _L, _I, _F, _P]),
    "crossentropy_softcap_backward": (None, [_P, _P, _L, _I, _F, _F, _P]),
    "crossentropy_shard_max": (None, [_P, _P, _L, _I]),
    "crossentropy_shard_sums": (None, [_P, _P, _P, _P, _I, _L, _I]),
    "crossentropy_shard_softcap_backward": (None, [_P, _P, _P, _P, _I, _L, _I, _F, _F, _P]),
    "adamw_update": (None, [_P, _P, _P, _P, _L, _F, _F, _F, _F, _F, _L, _F]),
    "sum_squares": (ctypes.c_double, [_P, _L]),
    "scale_inplace": (None, [_P, _L, _F]),
    "bf16_round_rows": (None, [_P, _P, _L, _I]),
    "dotbf16_act_elems": (_L, [_L, _I]),
    "dotbf16_pack_elems": (_L, [_I, _I]),
    "dotbf16_pack": (None, [_P, _P, _I, _I, _I]),
    "matmul_dotbf16_forward": (None, [_P, _P, _P, _P, _L, _I, _I]),
    "matmul_dotbf16_vdp": (_I, []),
    "loom_isa_detect": (_I, []),
    "loom_isa_active": (_I, []),
    "loom_isa_set": (_I, [_I, _P]),
    "loom_isa_name": (ctypes.c_char_p, [_I]),
}

_lib = None


def lib_path():
    return os.environ.get("LOOM_LIB") or os.path.join(_REPO, "build", "libloom.so")


def lib():
    """The loaded libloom (cached), with the kernel signatures declared."""
    global _lib
    if _lib is None:
        path = lib_path()
        if not os.path.exists(path):
            sys.exit(f"loomlib: {path} not found (build first, or set LOOM_LIB)")
        _lib = ctypes.CDLL(path)
        for name, (res, args) in KERNELS.items():
            fn = getattr(_lib, name, None)
            if fn is None:
                continue  # a partial library still serves the tests that need other symbols
            fn.restype = res
            fn.argtypes = args
    return _lib


def f32(a):
    """A C-contiguous float32 copy of a (numpy array, torch tensor or list)."""
    if hasattr(a, "detach"):
        a = a.detach().cpu().numpy()
    return np.ascontiguousarray(np.array(a, dtype=np.float32))


def i32(a):
    if hasattr(a, "detach"):
        a = a.detach().cpu().numpy()
    return np.ascontiguousarray(np.array(a, dtype=np.int32))


def _ptr(a, dtype):
    if a is None:
        return None
    if not isinstance(a, np.ndarray) or a.dtype != dtype or not a.flags["C_CONTIGUOUS"]:
        raise TypeError(f"expected a C-contiguous {np.dtype(dtype).name} numpy array")
    return a.ctypes.data


def fptr(a):
    """float* for a C-contiguous float32 array (None -> NULL)."""
    return _ptr(a, np.float32)


def iptr(a):
    """int32_t* for a C-contiguous int32 array (None -> NULL)."""
    return _ptr(a, np.int32)


def rel_err(got, ref):
    """max |got - ref| / max |ref| (both converted to float64)."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    scale = max(float(np.max(np.abs(ref))) if ref.size else 0.0, 1e-30)
    return float(np.max(np.abs(got - ref))) / scale if ref.size else 0.0


# ---- checks shared by the reference tests ------------------------------------------------
FAILURES = []  # what failed, in order; a test ends with exit status 1 when it is not empty


def check(what, value, tol):
    """An error measure against its tolerance (NaN fails); recorded in FAILURES when over."""
    ok = bool(value <= tol)
    print(f"  {'ok  ' if ok else 'FAIL'} {what}: {value:.3e} (tol {tol:.0e})")
    if not ok:
        FAILURES.append(f"{what}: {value:.3e} > {tol:.0e}")
    return ok


def expect(what, cond, detail=""):
    """A condition that must hold; recorded in FAILURES when it does not."""
    print(f"  {'ok  ' if cond else 'FAIL'} {what}{(': ' + detail) if detail else ''}")
    if not cond:
        FAILURES.append(f"{what} {detail}")
    return cond


def finish(what="all checks passed"):
    """The test's summary: every failure listed and 1, or WHAT and 0 (the exit status)."""
    if FAILURES:
        print(f"\n{len(FAILURES)} FAILURE(S):")
        for f in FAILURES:
            print("  " + f)
        return 1
    print("\n" + what)
    return 0


def rel_max(a, ref):
    """max |a - ref| / max |ref| (1 when ref is all zeros), in float64."""
    a = np.asarray(a, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    scale = np.abs(ref).max()
    return float(np.abs(a - ref).max() / (scale if scale > 0 else 1.0))
