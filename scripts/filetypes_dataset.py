#!/usr/bin/env python3
"""Collects a labelled file-type corpus from this machine's own files, for the byte classifier.

Walks a few system directories, asks libmagic (the `file` command) for each file's MIME type,
maps it to a class (executable, shared-library, object, gzip, png, python-bytecode, text,
shell-script, ...), takes up to --per-class files per class (a deterministic choice: sorted by
SHA-256 of the path), copies them into OUT/files/ under neutral names (so the label cannot
leak through the name) and writes OUT/labels.jsonl ({"path": ..., "label": ...}).
Then `loom data build recipes/filetypes.yaml` turns OUT into labelled shards.
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys

ROOTS = ["/usr/bin", "/usr/sbin", "/usr/lib", "/usr/share/doc", "/usr/share/icons",
         "/usr/share/pixmaps", "/usr/include", "/usr/share/perl5", "/etc"]

# MIME type (libmagic) -> class
CLASSES = {
    "application/x-pie-executable": "executable",
    "application/x-executable": "executable",
    "application/x-sharedlib": "shared-library",
    "application/x-object": "object",
    "application/gzip": "gzip",
    "image/png": "png",
    "application/x-bytecode.python": "python-bytecode",
    "text/x-bytecode.python": "python-bytecode",
    "text/x-c": "c-source",
    "text/x-shellscript": "shell-script",
    "text/x-perl": "perl-script",
    "application/x-archive": "ar-archive",
}


def candidates(max_bytes):
    for root in ROOTS:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for f in sorted(filenames):
                p = os.path.join(dirpath, f)
                try:
                    if os.path.islink(p) or not os.path.isfile(p):
                        continue
                    size = os.path.getsize(p)
                except OSError:
                    continue
                if 64 <= size <= max_bytes and os.access(p, os.R_OK):
                    yield p


def mime_types(paths):
    """libmagic MIME types of many files, in batches of `file` invocations."""
    out = {}
    for i in range(0, len(paths), 500):
        batch = paths[i:i + 500]
        res = subprocess.run(["file", "--mime-type", "-N", "-0", "--"] + batch,
                             capture_output=True, check=True)
        fields = res.stdout.split(b"\n")
        for line in fields:
            if b"\0" not in line:
                continue
            p, m = line.split(b"\0", 1)
            out[p.decode("utf-8", "surrogateescape")] = m.decode().strip().lstrip(":").strip()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out", help="output directory (files/ and labels.jsonl)")
    ap.add_argument("--per-class", type=int, default=200)
    ap.add_argument("--max-bytes", type=int, default=2 << 20)
    ap.add_argument("--max-candidates", type=int, default=40000,
                    help="files examined with libmagic (a deterministic sample of the walk)")
    ap.add_argument("--min-per-class", type=int, default=20,
                    help="classes with fewer files on this machine are left out")
    a = ap.parse_args()
    if shutil.which("file") is None:
        sys.exit("filetypes_dataset: the `file` command (libmagic) is missing: apt-get install file")
    paths = list(candidates(a.max_bytes))
    # cheap pre-selection per extension-agnostic bucket keeps `file` calls bounded
    paths.sort(key=lambda p: hashlib.sha256(p.encode("utf-8", "surrogateescape")).hexdigest())
    paths = paths[:a.max_candidates]
    types = mime_types(paths)
    by_class = {}
    for p in paths:
        c = CLASSES.get(types.get(p, ""))
        if c is None and types.get(p, "").startswith("text/plain"):
            c = "text"
        if c:
            by_class.setdefault(c, []).append(p)
    files_dir = os.path.join(a.out, "files")
    if os.path.isdir(files_dir):
        shutil.rmtree(files_dir)
    os.makedirs(files_dir)
    labels, n = [], 0
    for c in sorted(by_class):
        chosen = by_class[c][:a.per_class]
        if len(chosen) < a.min_per_class:
            print(f"filetypes_dataset: skipping class {c}: only {len(chosen)} files", file=sys.stderr)
            continue
        for p in chosen:
            name = f"f{n:06d}.bin"
            shutil.copyfile(p, os.path.join(files_dir, name))
            labels.append({"path": name, "label": c, "source": p})
            n += 1
        print(f"  {c:16s} {len(chosen):5d} files", file=sys.stderr)
    with open(os.path.join(a.out, "labels.jsonl"), "w") as fh:
        for r in labels:
            fh.write(json.dumps(r) + "\n")
    print(f"filetypes_dataset: {n} files in {len(set(r['label'] for r in labels))} classes -> {a.out}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
