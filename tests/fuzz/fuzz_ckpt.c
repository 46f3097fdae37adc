/* Fuzz target: opening a checkpoint step directory (include/loom/checkpoint.h) and filling
 * a rank's pieces from it (include/loom/ckpt_pieces.h).
 *
 * Input: one control byte, then a file. Bit 0 clear: the file is the piece file
 * rank_00000.safetensors, and the harness writes the manifest.json and COMPLETE that match
 * it (so every input gets past the SHA-256 checks to the safetensors and piece parsing).
 * Bit 0 set: the file is manifest.json, beside a valid piece file, with COMPLETE holding its
 * SHA-256. Then loom_ckpt_open, and loom_pieces_fill for the tiny model of fuzz_common.h; then
 * the same with the piece file deferred (loom_ckpt_open_ex), which must fill the same. */
#include "fuzz_common.h"
#include "loom/checkpoint.h"
#include "loom/ckpt_pieces.h"

static char dir[600];
static char *fixture;
static size_t fixture_len;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_path(dir, sizeof dir, "ckpt/step_0000001");
    loom_err err;
    if (loom_mkdirs(dir, &err) != 0) abort();
    fuzz_fixture_pieces(&fixture, &fixture_len);
    return 0;
}

static void put(const char *name, const void *data, size_t len) {
    char p[700];
    fuzz_write(loom_pathf(p, sizeof p, "%s/%s", dir, name), data, len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > (1u << 20)) return 0;
    const uint8_t *file = data + 1;
    const size_t n = size - 1;
    char *manifest;
    size_t manifest_len;
    if (data[0] & 1) {
        put("rank_00000.safetensors", fixture, fixture_len);
        manifest = malloc(n + 1);
        memcpy(manifest, file, n);
        manifest_len = n;
    } else {
        put("rank_00000.safetensors", file, n);
        manifest = fuzz_ckpt_manifest("rank_00000.safetensors", file, n);
        manifest_len = strlen(manifest);
    }
    put("manifest.json", manifest, manifest_len);
    char hex[66];
    loom_sha256_hex(manifest, manifest_len, hex);
    strcat(hex, "\n");
    put("COMPLETE", hex, 65);
    free(manifest);

    /* the eager open (training resume) and the deferred one (inference loads: the piece
     * file streamed through its SHA-256 by loom_pieces_fill) must agree: whatever the eager
     * path fills, the deferred path fills the same (it may accept more: it does not need the
     * tensors 4-byte aligned in memory) */
    loom_ckpt *ck = NULL;
    loom_err err;
    float buf[300], buf2[300];
    loom_dp_piece need[FUZZ_N_NEEDED];
    int rc_eager = -1;
    if (loom_ckpt_open(dir, &ck, &err) != 0) {
        FUZZ_REQUIRE(ck == NULL && err.msg[0] != 0);
    } else {
        FUZZ_REQUIRE(loom_ckpt_step(ck) == 1);
        for (int i = 0; i < loom_ckpt_num_files(ck); i++) {
            size_t len = 0;
            FUZZ_REQUIRE(loom_ckpt_file_data(ck, loom_ckpt_file_name(ck, i), &len) != NULL);
        }
        memset(buf, 0, sizeof buf);
        fuzz_needed_pieces(need, buf);
        rc_eager = loom_pieces_fill(ck, need, FUZZ_N_NEEDED, &err);
        loom_ckpt_close(ck);
    }
    ck = NULL;
    if (loom_ckpt_open_ex(dir, loom_pieces_is_file, &ck, &err) != 0) {
        FUZZ_REQUIRE(ck == NULL && err.msg[0] != 0 && rc_eager != 0);
        return 0;
    }
    memset(buf2, 0, sizeof buf2);
    fuzz_needed_pieces(need, buf2);
    const int rc_deferred = loom_pieces_fill(ck, need, FUZZ_N_NEEDED, &err);
    FUZZ_REQUIRE(rc_eager != 0 || (rc_deferred == 0 && memcmp(buf, buf2, sizeof buf) == 0));
    loom_ckpt_close(ck);
    return 0;
}
