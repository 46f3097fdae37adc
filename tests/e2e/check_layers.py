#!/usr/bin/env python3
"""The layering check (tests/e2e/test_layers.sh, docs/architecture.md "Modules").

Every C file of src/ and every public header of include/loom/ belongs to a module (its folder of
src/; a public header to the module named in HEADERS). Each of its #include lines and each call
of an external library in its code (comments and string literals removed) is checked against
MAY_USE and LIBS below; and a file over 1,000 lines says why in its opening comment ("Why one
file: ...") or is listed in LONG_FILES, to be split. A break prints FILE:LINE: the rule, and
the exit status is 1.

Usage: check_layers.py ROOT   (ROOT holds src/ and include/loom/)
"""
import os
import re
import sys

# ---- the table (docs/architecture.md shows the same) -------------------------------------------
# module -> the modules it may use (besides itself). Lower layers never use higher ones.
MAY_USE = {
    "base": [],
    # kernels: loom/backend.h's table only, for device buffers (staging copies, NCCL's stream)
    "comm": ["base", "kernels"],
    "kernels": ["base"],
    # the CUDA backend (src/cuda: .cu files, and the emulator's headers): the op table it fills
    "cuda": ["base", "kernels"],
    "model": ["base", "comm", "kernels"],
    "parallel": ["base", "comm", "kernels", "model"],
    "data": ["base"],
    # the kernels through loom/backend.h's table only: the profiling twin, the peak probe
    "obs": ["base", "kernels"],
    "hf": ["base", "model", "data"],
    # checkpoints (format, pieces), the run config's schema, loading a model for inference
    "ckpt": ["base", "comm", "kernels", "model", "parallel", "data"],
    # the memory and time model of a layout, the layout search (the trainer's own accounting:
    # model views, the DP engine's storage rules, the mesh's rules)
    "plan": ["base", "comm", "kernels", "model", "parallel"],
    "train": ["base", "comm", "kernels", "model", "parallel", "data", "hf", "obs", "ckpt", "plan",
              "infer"],
    "interop": ["base", "comm", "kernels", "model", "parallel", "data", "hf", "obs", "ckpt",
                "train"],
    "infer": ["base", "comm", "kernels", "model", "data"],
    "synth": ["base", "comm", "kernels", "model", "data", "infer", "obs", "ckpt"],
    "cli": ["base", "comm", "kernels", "model", "parallel", "data", "obs", "hf", "ckpt", "train",
            "interop", "infer", "synth", "plan"],
}

# module -> the external libraries it may call (families of LIB_RULES below); libc is everyone's
LIBS = {
    "base": ["jansson", "yaml", "openssl", "xxhash"],
    "comm": ["mpi"],
    "kernels": ["blas", "onednn", "openmp"],
    "cuda": [],
    "model": [],
    "parallel": [],
    "plan": [],
    # (recipes' YAML is read by base: base/yaml.h)
    "data": ["jansson", "openssl", "xxhash", "icu", "pcre2", "zstd"],
    # openmp: the peak probe's thread count (omp_set_num_threads)
    "obs": ["jansson", "sockets", "openmp"],
    "hf": ["jansson"],
    # openssl: checkpoint digests
    "ckpt": ["jansson", "openssl"],
    # openmp: the thread count only (omp_set_num_threads)
    "train": ["jansson", "openmp"],
    "interop": ["jansson"],
    "infer": ["jansson", "sockets", "http"],
    # (its pipelines' YAML is read by base: loom_yaml_json_file, base/yaml.h)
    "synth": ["jansson", "pcre2", "zstd", "http"],
    "cli": ["jansson", "openmp"],
}

# public header (include/loom/) -> the module that owns it
HEADERS = {
    "base.h": "base", "config.h": "base", "signals.h": "base", "safetensors.h": "base",
    "bf16.h": "base", "fp16.h": "base", "progress.h": "base",
    "comm.h": "comm",
    "backend.h": "kernels", "kernels.h": "kernels",
    "model.h": "model", "model_config.h": "model", "lora.h": "model",
    "parallel.h": "parallel", "cp.h": "parallel", "ep.h": "parallel", "pp.h": "parallel",
    "tp.h": "parallel", "optim.h": "parallel",
    "data.h": "data", "tokenizer.h": "data", "chat.h": "data", "windows.h": "data",
    "alerts.h": "obs", "metrics.h": "obs", "obs_sinks.h": "obs", "profile.h": "obs",
    "report.h": "obs",
    "hf.h": "hf",
    "checkpoint.h": "ckpt", "ckpt_pieces.h": "ckpt", "load.h": "ckpt",
    "train.h": "train", "schedule.h": "train", "preference.h": "train", "grpo.h": "train",
    "peak.h": "obs", "interop.h": "interop", "plan.h": "plan",
    "infer.h": "infer", "serve.h": "infer", "grammar.h": "infer",
    "synth.h": "synth",
}

# Private headers ("folder/x.h" beside the sources) are their folder's own, except these, which
# their module shares with every module that may use it.
SHARED_PRIVATE = {"base/json_util.h", "base/yaml.h"}

# loom/kernels.h (the kernel functions themselves) is for kernels/ alone; everyone else calls
# ops through loom/backend.h's table
# (tests/e2e/test_backend_confined.sh checks the calls).
KERNELS_H_USERS = {"kernels"}

# Temporary exceptions: (path prefix, what: a module, a library family or a private header, why).
# Each one must still match something, so a fix removes its line.
EXCEPTIONS = [
]

# ---- external libraries: how an include and a call of each look ---------------------------------
LIB_RULES = {
    "blas": (r"cblas\.h|f77blas\.h|openblas", r"\bcblas_\w+"),
    "onednn": (r"dnnl\w*\.h|oneapi/dnnl", r"\bdnnl_\w+"),
    "mpi": (r"mpi\.h", r"\bP?MPI_\w+"),
    "openmp": (r"omp\.h", r"\bomp_\w+\s*\("),
    "jansson": (r"jansson\.h",
                r"\bjson_(?:object|array|string|integer|real|number|true|false|null|boolean|is_"
                r"|typeof|incref|decref|load|dump|pack|unpack|vpack|vunpack|equal|copy|deep_copy"
                r"|sprintf|vsprintf|set_alloc|get_alloc)\w*|\bjson_(?:t|error_t|int_t|type)\b"),
    "yaml": (r"yaml\.h", r"\byaml_\w+"),
    "openssl": (r"openssl/", r"\b(?:EVP_\w+|SHA(?:1|224|256|384|512)(?:_\w+)?\s*\(|MD5\w*\s*\()"),
    "icu": (r"unicode/", r"\b(?:u_\w+|unorm2_\w+|ubrk_\w+|ucol_\w+|ucnv_\w+)\s*\("),
    "xxhash": (r"xxhash\.h", r"\bXXH\w+"),
    "pcre2": (r"pcre2\.h", r"\bpcre2_\w+"),
    "zstd": (r"zstd\.h", r"\bZSTD_\w+"),
    "sockets": (r"sys/socket\.h|netinet/|arpa/inet\.h|netdb\.h|sys/un\.h",
                r"(?<![\w.>])(?:socket|bind|listen|accept4?|connect|setsockopt|getsockopt"
                r"|getaddrinfo|freeaddrinfo|inet_pton|inet_ntop|htons|ntohs|htonl|ntohl)\s*\("),
    "http": (r"microhttpd\.h|curl/", r"\b(?:MHD_\w+|curl_\w+)"),
}
LIB_INC = [(fam, re.compile(inc)) for fam, (inc, _) in LIB_RULES.items()]
LIB_CALL = [(fam, re.compile(call)) for fam, (_, call) in LIB_RULES.items()]
INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"]+)[>"]', re.M)


TOKENS = re.compile(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)


def strip(text, blank_strings):
    """text with comments (and, if blank_strings, string and char literals) blanked; newlines
    kept so line numbers stay."""
    def blank(m):
        t = m.group(0)
        if t[0] == "/":
            return re.sub(r"[^\n]", " ", t)
        return t[0] + " " * (len(t) - 2) + t[0] if blank_strings else t
    return TOKENS.sub(blank, text)


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


def allowed(path, module, what):
    """what (a module, a library family or a private header) is allowed in path (exceptions
    aside)."""
    for i, (prefix, w, _) in enumerate(EXCEPTIONS):
        if w == what and path.startswith(prefix):
            USED.add(i)
            return True
    return False


USED = set()


def check_file(root, path, module, breaks):
    with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
        text = f.read()
    code = strip(text, blank_strings=False)
    for m in INCLUDE.finditer(code):
        kind, name = m.group(1), m.group(2)
        line = line_of(code, m.start())
        where = f"{path}:{line}"
        if kind == "<":
            for fam, rx in LIB_INC:
                if rx.search(name) and fam not in LIBS[module] and not allowed(path, module, fam):
                    breaks.append(f"{where}: {module} may not use {fam} (#include <{name}>; "
                                  f"{module} may use: {', '.join(LIBS[module]) or 'libc only'})")
            continue
        if name.startswith("loom/"):
            h = name[5:]
            owner = HEADERS.get(h)
            if owner is None:
                breaks.append(f"{where}: include/loom/{h} has no module in the table "
                              f"(tests/e2e/check_layers.py HEADERS)")
                continue
            if h == "kernels.h" and module not in KERNELS_H_USERS and not allowed(path, module, owner):
                breaks.append(f"{where}: {module} may not include loom/kernels.h (ops go through "
                              f"loom/backend.h's table)")
                continue
        else:
            # a private header: "folder/x.h" from src/, or a name beside the including file
            parts = name.split("/")
            owner = parts[0] if len(parts) > 1 else module
            if owner not in MAY_USE:
                breaks.append(f"{where}: #include \"{name}\": no module '{owner}' in the table")
                continue
            if owner != module and name not in SHARED_PRIVATE:
                if not allowed(path, module, name):
                    breaks.append(f"{where}: {module} may not include {owner}'s private header "
                                  f"\"{name}\" (use {owner}'s public header in include/loom/)")
                continue
        if owner != module and owner not in MAY_USE[module] and not allowed(path, module, owner):
            breaks.append(f"{where}: {module} may not use {owner} (#include \"{name}\"; "
                          f"{module} may use: {', '.join(MAY_USE[module]) or 'nothing'})")
    calls = strip(text, blank_strings=True)
    calls = re.sub(r"^[ \t]*#[ \t]*(include|pragma)[^\n]*", "", calls, flags=re.M)
    for fam, rx in LIB_CALL:
        if fam in LIBS[module]:
            continue
        for m in rx.finditer(calls):
            if allowed(path, module, fam):
                break
            breaks.append(f"{path}:{line_of(calls, m.start())}: {module} may not call {fam} "
                          f"({m.group(0).strip()}; {module} may use: "
                          f"{', '.join(LIBS[module]) or 'libc only'})")


# A file of src/ over MAX_LINES says why in its opening comment ("Why one file: ..."), or is
# listed here, to be split (path: why it is not split yet). Each entry must still apply.
MAX_LINES = 1000
LONG_FILES = {
}


def check_length(root, rel, breaks, long_used):
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
        text = f.read()
    n = text.count("\n")
    if n <= MAX_LINES:
        return
    if rel in LONG_FILES:
        long_used.add(rel)
        return
    m = re.match(r"\s*/\*(.*?)\*/", text, re.S)
    if not m or "Why one file:" not in re.sub(r"\s*\n\s*\*?\s*", " ", m.group(1)):
        breaks.append(f"{rel}:1: {n} lines (over {MAX_LINES}) and its opening comment has no "
                      f"'Why one file:' sentence: split it or say why it is one")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    root = sys.argv[1]
    breaks, files, long_used = [], 0, set()
    for mod in sorted(os.listdir(os.path.join(root, "src"))):
        d = os.path.join(root, "src", mod)
        if not os.path.isdir(d):
            continue
        if mod not in MAY_USE:
            breaks.append(f"src/{mod}/: a module missing from the table (tests/e2e/check_layers.py)")
            continue
        for dirpath, _, names in os.walk(d):
            for fn in sorted(names):
                if fn.endswith((".c", ".h")):
                    rel = os.path.relpath(os.path.join(dirpath, fn), root)
                    check_file(root, rel, mod, breaks)
                    check_length(root, rel, breaks, long_used)
                    files += 1
    inc = os.path.join(root, "include", "loom")
    for fn in sorted(os.listdir(inc)):
        if not fn.endswith(".h"):
            continue
        if fn not in HEADERS:
            breaks.append(f"include/loom/{fn}:1: no module in the table (check_layers.py HEADERS)")
            continue
        check_file(root, f"include/loom/{fn}", HEADERS[fn], breaks)
        files += 1
    for h, mod in HEADERS.items():
        if not os.path.exists(os.path.join(inc, h)):
            breaks.append(f"check_layers.py: HEADERS names include/loom/{h}, which does not exist")
    for i, (prefix, what, why) in enumerate(EXCEPTIONS):
        if i not in USED:
            breaks.append(f"check_layers.py: the exception ({prefix}, {what}: {why}) matches "
                          f"nothing any more: remove it")
    for rel, why in LONG_FILES.items():
        if rel not in long_used:
            breaks.append(f"check_layers.py: LONG_FILES lists {rel} ({why}), which is no longer "
                          f"over {MAX_LINES} lines (or gone): remove it")
    for b in breaks:
        print(b)
    print(f"{files} files checked, {len(breaks)} layer breaks, "
          f"{len(USED)} temporary exceptions used", file=sys.stderr)
    sys.exit(1 if breaks else 0)


if __name__ == "__main__":
    main()
