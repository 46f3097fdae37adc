"""loom's safetensors against the reference implementation (the `safetensors` PyPI package).

1. loom_safetensors_write -> safetensors.numpy.load_file: names, shapes, values, metadata.
2. safetensors.numpy.save_file -> loom_safetensors_open + get / read_into: same checks.
3. The reference rejects nothing loom writes, and loom rejects a file the reference would
   (overlapping offsets), naming the file.
Exits non-zero on any mismatch.
"""
import ctypes
import os
import struct
import sys
import tempfile

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
LIB = os.environ.get("LOOM_LIB") or os.path.join(HERE, "..", "..", "build", "libloom.so")


class StTensor(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("data", ctypes.POINTER(ctypes.c_float)),
        ("ndim", ctypes.c_int),
        ("shape", ctypes.c_int64 * 8),
        ("dtype", ctypes.c_char_p),  # NULL: F32
    ]


def load_lib():
    lib = ctypes.CDLL(LIB)
    lib.loom_safetensors_write.argtypes = [ctypes.c_char_p, ctypes.POINTER(StTensor), ctypes.c_int,
                                           ctypes.POINTER(ctypes.c_char_p), ctypes.c_char_p]
    lib.loom_safetensors_write.restype = ctypes.c_int
    lib.loom_safetensors_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p),
                                          ctypes.c_char_p]
    lib.loom_safetensors_open.restype = ctypes.c_int
    lib.loom_safetensors_close.argtypes = [ctypes.c_void_p]
    lib.loom_safetensors_count.argtypes = [ctypes.c_void_p]
    lib.loom_safetensors_count.restype = ctypes.c_int
    lib.loom_safetensors_get.argtypes = [ctypes.c_void_p, ctypes.c_char_p,
                                         ctypes.POINTER(ctypes.POINTER(ctypes.c_float)),
                                         ctypes.POINTER(ctypes.c_int), ctypes.c_int64 * 8,
                                         ctypes.c_char_p]
    lib.loom_safetensors_get.restype = ctypes.c_int
    lib.loom_safetensors_read_into.argtypes = [ctypes.c_void_p, ctypes.c_char_p,
                                               ctypes.POINTER(ctypes.c_float), ctypes.c_int,
                                               ctypes.POINTER(ctypes.c_int64), ctypes.c_char_p]
    lib.loom_safetensors_read_into.restype = ctypes.c_int
    lib.loom_safetensors_read_raw.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                              ctypes.c_void_p, ctypes.c_int,
                                              ctypes.POINTER(ctypes.c_int64), ctypes.c_char_p]
    lib.loom_safetensors_read_raw.restype = ctypes.c_int
    lib.loom_safetensors_metadata.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.loom_safetensors_metadata.restype = ctypes.c_char_p
    return lib


FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what)


def make_tensors(rng):
    return {
        "model.wte": rng.standard_normal((17, 8)).astype(np.float32),
        "model.h.0.attn.qkv_w": rng.standard_normal((3, 4, 5)).astype(np.float32),
        "model.h.0.ln.b": rng.standard_normal((8,)).astype(np.float32),
        "scalar": np.array(np.float32(-1.5)),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "specials": np.array([np.inf, -np.inf, 0.0, -0.0, 1e-45, 3.4e38], dtype=np.float32),
        "unicode.\u00e9\u4e2d": np.arange(6, dtype=np.float32).reshape(2, 3),
    }


ST_DTYPES = {np.dtype(np.float64): b"F64", np.dtype(np.int32): b"I32"}


def loom_write(lib, path, tensors, metadata):
    arr = (StTensor * len(tensors))()
    keep = []
    for i, (name, a) in enumerate(tensors.items()):
        dt = ST_DTYPES.get(a.dtype)  # F64 / I32 as they are; everything else as F32
        a = np.require(a, dtype=a.dtype if dt else np.float32, requirements="C")  # keeps 0-d arrays 0-d
        keep.append(a)
        arr[i].name = name.encode()
        arr[i].data = a.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        arr[i].dtype = dt
        arr[i].ndim = a.ndim
        for d, s in enumerate(a.shape):
            arr[i].shape[d] = s
    flat = []
    for k, v in metadata.items():
        flat += [k.encode(), v.encode()]
    meta = (ctypes.c_char_p * (len(flat) + 1))(*flat, None)
    err = ctypes.create_string_buffer(2048)
    rc = lib.loom_safetensors_write(path.encode(), arr, len(tensors), meta, err)
    check(rc == 0, f"loom_safetensors_write: {err.value.decode()}")


def loom_read_all(lib, path, names):
    f = ctypes.c_void_p()
    err = ctypes.create_string_buffer(2048)
    rc = lib.loom_safetensors_open(path.encode(), ctypes.byref(f), err)
    if rc != 0:
        check(False, f"loom_safetensors_open: {err.value.decode()}")
        return None, None
    out = {}
    for name in names:
        p = ctypes.POINTER(ctypes.c_float)()
        ndim = ctypes.c_int()
        shape = (ctypes.c_int64 * 8)()
        rc = lib.loom_safetensors_get(f, name.encode(), ctypes.byref(p), ctypes.byref(ndim), shape,
                                      err)
        check(rc == 0, f"get {name}: {err.value.decode()}")
        if rc != 0:
            continue
        dims = tuple(shape[d] for d in range(ndim.value))
        n = int(np.prod(dims)) if dims else 1
        if n:
            a = np.ctypeslib.as_array(p, shape=(n,)).copy().reshape(dims)
        else:
            a = np.zeros(dims, dtype=np.float32)
        # read_into must agree with get
        dst = np.full(max(n, 1), np.nan, dtype=np.float32)
        shp = (ctypes.c_int64 * 8)(*dims)
        rc = lib.loom_safetensors_read_into(f, name.encode(),
                                            dst.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                                            len(dims), shp, err)
        check(rc == 0, f"read_into {name}: {err.value.decode()}")
        check(np.array_equal(dst[:n].reshape(dims), a, equal_nan=True), f"read_into {name} values")
        out[name] = a
    return f, out


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def main():
    lib = load_lib()
    rng = np.random.default_rng(1234)
    tensors = make_tensors(rng)
    metadata = {"format": "pt", "loom.step": "42", "note": "caf\u00e9 \"quoted\" \\ slash"}
    with tempfile.TemporaryDirectory() as tmp:
        # 1. loom writes, the reference reads
        p1 = os.path.join(tmp, "loom.safetensors")
        loom_write(lib, p1, tensors, metadata)
        ref = load_file(p1)
        check(set(ref) == set(tensors), f"reference sees names {sorted(ref)}")
        for name, a in tensors.items():
            check(name in ref and same(ref[name], a), f"reference value of {name}")
        with safe_open(p1, framework="np") as sf:
            check(sf.metadata() == metadata, f"reference metadata {sf.metadata()}")
        with open(p1, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
        check(n % 8 == 0, f"header length {n} is a multiple of 8")

        # 2. the reference writes, loom reads
        p2 = os.path.join(tmp, "ref.safetensors")
        save_file(tensors, p2, metadata=metadata)
        f, got = loom_read_all(lib, p2, list(tensors))
        if f is not None:
            check(lib.loom_safetensors_count(f) == len(tensors), "loom count")
            for name, a in tensors.items():
                check(name in got and same(got[name], a), f"loom value of {name}")
            for k, v in metadata.items():
                m = lib.loom_safetensors_metadata(f, k.encode())
                check(m is not None and m.decode() == v, f"loom metadata {k}: {m!r}")
            check(lib.loom_safetensors_metadata(f, b"absent") is None, "absent metadata")
            # a name that is not there: error names the file and the tensor
            err = ctypes.create_string_buffer(2048)
            p = ctypes.POINTER(ctypes.c_float)()
            rc = lib.loom_safetensors_get(f, b"nope", ctypes.byref(p), None,
                                          (ctypes.c_int64 * 8)(), err)
            msg = err.value.decode()
            check(rc == -1 and p2 in msg and "'nope'" in msg, f"absent tensor error: {msg}")
            lib.loom_safetensors_close(f)

        # 3. mixed dtypes from the reference: F32 readable, others refused by name
        p3 = os.path.join(tmp, "mixed.safetensors")
        save_file({"f": np.ones((2, 2), np.float32), "h": np.ones(3, np.float16),
                   "i": np.arange(5, dtype=np.int64)}, p3)
        f, got = loom_read_all(lib, p3, ["f"])
        if f is not None:
            check(same(got.get("f", np.zeros(0)), np.ones((2, 2), np.float32)), "mixed f")
            err = ctypes.create_string_buffer(2048)
            rc = lib.loom_safetensors_get(f, b"h", ctypes.byref(ctypes.POINTER(ctypes.c_float)()),
                                          None, (ctypes.c_int64 * 8)(), err)
            check(rc == -1 and "F16" in err.value.decode(), f"F16 refused: {err.value.decode()}")
            lib.loom_safetensors_close(f)

        # 4. F64 and I32 tensors (GRPO's rollout batch in a checkpoint): loom writes them, the
        # reference reads the same values; loom reads them back bit for bit (read_raw), and
        # refuses another dtype by name
        p5 = os.path.join(tmp, "typed.safetensors")
        typed = {"f64": np.array([1 / 3, -2.5e-300, np.inf, 7.0]),
                 "i32": np.array([[-1, 0, 2 ** 31 - 1], [5, -2 ** 31, 9]], dtype=np.int32)}
        loom_write(lib, p5, typed, {"format": "pt"})
        ref5 = load_file(p5)
        for name, a in typed.items():
            check(name in ref5 and same(ref5[name], a), f"reference value of {name} (typed)")
        fp = ctypes.c_void_p()
        err = ctypes.create_string_buffer(2048)
        if lib.loom_safetensors_open(p5.encode(), ctypes.byref(fp), err) == 0:
            for name, dt in (("f64", b"F64"), ("i32", b"I32")):
                a = typed[name]
                dst = np.zeros_like(a)
                shp = (ctypes.c_int64 * 8)(*a.shape)
                rc = lib.loom_safetensors_read_raw(fp, name.encode(), dt, dst.ctypes.data, a.ndim, shp, err)
                check(rc == 0 and same(dst, a), f"read_raw {name}: {err.value.decode()}")
            rc = lib.loom_safetensors_read_raw(fp, b"f64", b"F32", np.zeros(4, np.float32).ctypes.data, 1,
                                               (ctypes.c_int64 * 8)(4), err)
            check(rc == -1 and "F64" in err.value.decode() and "'f64'" in err.value.decode(),
                  f"read_raw of another dtype refused: {err.value.decode()}")
            lib.loom_safetensors_close(fp)
        else:
            check(False, f"open typed: {err.value.decode()}")

        # 5. overlapping offsets (hand-made): loom refuses, naming the file
        p4 = os.path.join(tmp, "overlap.safetensors")
        hdr = (b'{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},'
               b'"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}}')
        with open(p4, "wb") as fh:
            fh.write(struct.pack("<Q", len(hdr)) + hdr + bytes(24))
        fp = ctypes.c_void_p()
        err = ctypes.create_string_buffer(2048)
        rc = lib.loom_safetensors_open(p4.encode(), ctypes.byref(fp), err)
        msg = err.value.decode()
        check(rc == -1 and p4 in msg and "overlap" in msg, f"overlap refused: {msg}")

    if FAILURES:
        print(f"{len(FAILURES)} failure(s)")
        return 1
    print("safetensors compat: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
