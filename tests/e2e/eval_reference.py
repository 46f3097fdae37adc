"""Reference for `loom eval` / the trainer's val_loss over one pass (tests/e2e/test_eval_pass.sh,
tests/mpi/test_eval_pass_dp.sh): the mean next-token loss over every window of a dataset,
computed window by window through libloom's model forward (batch 1), enumerating the windows
from manifest.jsonl and the shards directly (not through the loader): window j of a shard is
tokens [j*T, j*T+T+1), j < (tokens-1)//T.

    python3 eval_reference.py CKPT DATA_DIR T   ->  {"windows": N, "loss": L, "per_source": {...}}
"""
import ctypes
import json
import os
import sys

import numpy as np


def main():
    ckpt, data, T = sys.argv[1], sys.argv[2], int(sys.argv[3])
    path = os.environ.get("LOOM_LIB") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "libloom.so")
    L = ctypes.CDLL(path)
    P = ctypes.c_void_p
    L.loom_load_model.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int,
                                  ctypes.POINTER(P), P, ctypes.c_char_p]
    L.loom_dataset_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(P), ctypes.c_char_p]
    L.loom_dataset_num_shards.argtypes = [P]
    L.loom_dataset_shard.argtypes = [P, ctypes.c_int]
    L.loom_dataset_shard.restype = P
    L.loom_shard_num_tokens.argtypes = [P]
    L.loom_shard_num_tokens.restype = ctypes.c_uint64
    L.loom_shard_read_tokens.argtypes = [P, ctypes.c_uint64, ctypes.c_uint64, P]
    L.loom_model_forward.argtypes = [P, P, P, ctypes.c_int, ctypes.c_int]
    L.loom_model_forward.restype = ctypes.c_float
    L.loom_model_free.argtypes = [P]
    L.loom_dataset_close.argtypes = [P]
    err = ctypes.create_string_buffer(4096)  # loom_err (char msg[2048])
    model, ds = P(), P()
    if L.loom_load_model(ckpt.encode(), 1, 1, ctypes.byref(model), None, err):
        sys.exit(f"eval_reference: {err.value.decode()}")
    if L.loom_dataset_open(data.encode(), ctypes.byref(ds), err):
        sys.exit(f"eval_reference: {err.value.decode()}")
    lines = [json.loads(x) for x in open(os.path.join(data, "manifest.jsonl")) if x.strip()]
    assert len(lines) == L.loom_dataset_num_shards(ds)
    total, n, per_source = 0.0, 0, {}
    buf = np.zeros(T + 1, dtype=np.int32)
    for i, line in enumerate(lines):
        sh = L.loom_dataset_shard(ds, i)
        tokens = L.loom_shard_num_tokens(sh)
        assert tokens == line["tokens"], (tokens, line)
        src = per_source.setdefault(line.get("source", ""), [0.0, 0])
        for j in range((tokens - 1) // T if tokens > T else 0):
            L.loom_shard_read_tokens(sh, j * T, T + 1, buf.ctypes.data)
            inp, tgt = np.ascontiguousarray(buf[:T]), np.ascontiguousarray(buf[1:])
            loss = float(L.loom_model_forward(model, inp.ctypes.data, tgt.ctypes.data, 1, T))
            total += loss
            n += 1
            src[0] += loss
            src[1] += 1
    L.loom_dataset_close(ds)
    L.loom_model_free(model)
    print(json.dumps({"windows": n, "loss": total / n,
                      "per_source": {k: {"windows": v[1], "loss": v[0] / v[1]}
                                     for k, v in per_source.items()}}))


if __name__ == "__main__":
    main()
