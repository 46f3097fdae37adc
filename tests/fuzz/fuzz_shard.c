/* Fuzz target: loom_shard_open on the bytes as a shard file (include/loom/data.h).
 *
 * Input: one control byte, then the file. The checksums would stop almost every mutation at
 * the header, so the control byte lets the harness repair them first (bit 0: the header
 * checksum, bit 1: the block checksums the header's own fields describe), which sends the
 * mutated counts, offsets, doc index and token ids on to the deeper checks. A shard that
 * opens is read back whole through the accessors. */
#include "fuzz_common.h"
#include <openssl/evp.h>

#define HDR 4096u

static uint64_t rd64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static void sha256(const uint8_t *p, size_t n, uint8_t out[32]) {
    unsigned int len = 0;
    if (EVP_Digest(p, n, out, &len, EVP_sha256(), NULL) != 1 || len != 32) abort();
}

/* Recomputes the block checksums where the header's fields put them (when they are in
 * bounds and few; the harness trusts nothing it reads either). */
static void fix_blocks(uint8_t *f, size_t n) {
    uint64_t block = rd64(f + 40), n_blocks = rd64(f + 48), tok_off = rd64(f + 56);
    uint64_t docs_off = rd64(f + 72), docs_bytes = rd64(f + 80), sums_off = rd64(f + 88);
    uint64_t lab_off = rd64(f + 272), lab_bytes = rd64(f + 280);
    uint64_t end = lab_off ? lab_off + lab_bytes : docs_off + docs_bytes;
    if (block < 4096 || block > n || n_blocks == 0 || n_blocks > 64) return;
    if (end < lab_off || end < docs_off || end > n || tok_off > end) return;
    if (sums_off > n || n_blocks * 32 > n - sums_off) return;
    for (uint64_t b = 0; b < n_blocks; b++) {
        uint64_t lo = tok_off + b * block;
        if (lo >= end) return;
        uint64_t hi = end - lo > block ? lo + block : end;
        sha256(f + lo, (size_t)(hi - lo), f + sums_off + 32 * b);
    }
}

static void fix_header(uint8_t *f) {
    uint8_t copy[HDR];
    memcpy(copy, f, HDR);
    memset(copy + 240, 0, 32);
    sha256(copy, HDR, f + 240);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > (1u << 20)) return 0;
    const uint8_t ctl = data[0];
    size_t n = size - 1;
    uint8_t *f = malloc(n ? n : 1);
    memcpy(f, data + 1, n);
    if (n >= HDR) {
        if (ctl & 2) fix_blocks(f, n);
        if (ctl & 1) fix_header(f);
    }
    char path[600];
    fuzz_path(path, sizeof path, "shard.bin");
    fuzz_write(path, f, n);
    free(f);

    loom_shard *s = NULL;
    loom_err err;
    if (loom_shard_open(path, &s, &err) != 0) {
        FUZZ_REQUIRE(s == NULL && err.msg[0] != 0);
        return 0;
    }
    const uint64_t nt = loom_shard_num_tokens(s), nd = loom_shard_num_docs(s);
    const uint32_t vocab = loom_shard_vocab_size(s);
    FUZZ_REQUIRE(nd <= nt && (nt == 0 || nd > 0));
    if (nt > 0) {
        int32_t *ids = malloc(nt * sizeof *ids);
        loom_shard_read_tokens(s, 0, nt, ids);
        for (uint64_t i = 0; i < nt; i++) FUZZ_REQUIRE(ids[i] >= 0 && (uint32_t)ids[i] < vocab);
        free(ids);
    }
    if (loom_shard_has_labels(s))
        for (uint64_t i = 0; i < nd; i++) (void)loom_shard_doc_label(s, i);
    loom_shard_close(s);
    return 0;
}
