"""Reads a PNG (8-bit RGB/RGBA, non-interlaced: what Chromium's --screenshot writes) with zlib
and the PNG filters, and fails when it is blank: fewer than 2% of the pixels differ from the
most common colour, or fewer than 16 colours. usage: png_check.py FILE"""
import collections, struct, sys, zlib

data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat, w = 8, b"", 0
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR":
        w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
        assert depth == 8 and ctype in (2, 6) and interlace == 0, (depth, ctype, interlace)
        bpp = 3 if ctype == 2 else 4
    elif kind == b"IDAT":
        idat += body
    pos += 12 + n
raw, stride = zlib.decompress(idat), w * bpp
prev, counts = bytearray(stride), collections.Counter()
for y in range(h):
    f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for x in range(stride):
        a = line[x - bpp] if x >= bpp else 0
        b, c = prev[x], prev[x - bpp] if x >= bpp else 0
        if f == 1: line[x] = (line[x] + a) & 255
        elif f == 2: line[x] = (line[x] + b) & 255
        elif f == 3: line[x] = (line[x] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    if y % 2 == 0:  # every other row is plenty
        counts.update(bytes(line[i:i + 3]) for i in range(0, stride, bpp * 2))
    prev = line
total, top = sum(counts.values()), counts.most_common(1)[0][1]
share = 1 - top / total
assert share >= 0.02 and len(counts) >= 16, f"blank screenshot: {share:.3%} non-background, {len(counts)} colours"
print(f"ok: screenshot {w}x{h}: {share:.1%} of the pixels drawn, {len(counts)} colours")
