/* Fuzz target: loom_safetensors_parse on the bytes (include/loom/safetensors.h); every tensor
 * of a file that parses is looked up, read through its pointer and copied out, and a few
 * metadata keys are looked up. */
#include "fuzz_common.h"
#include "loom/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (4u << 20)) return 0;
    /* a private copy at an 8-aligned address, like a file read into memory */
    char *buf = malloc(size ? size : 1);
    memcpy(buf, data, size);
    loom_st_file *f = NULL;
    loom_err err;
    if (loom_safetensors_parse(buf, size, "fuzz.safetensors", &f, &err) != 0) {
        FUZZ_REQUIRE(f == NULL && err.msg[0] != 0);
        free(buf);
        return 0;
    }
    const int n = loom_safetensors_count(f);
    FUZZ_REQUIRE(n >= 0);
    volatile float sink = 0;
    for (int i = 0; i < n; i++) {
        const char *name = loom_safetensors_name(f, i);
        FUZZ_REQUIRE(name != NULL);
        if (i > 0) FUZZ_REQUIRE(strcmp(loom_safetensors_name(f, i - 1), name) < 0);
        const float *p = NULL;
        int nd = -1;
        int64_t shape[8];
        if (loom_safetensors_get(f, name, &p, &nd, shape, &err) != 0) continue;
        FUZZ_REQUIRE(nd >= 0 && nd <= 8);
        uint64_t numel = 1;
        for (int d = 0; d < nd; d++) {
            FUZZ_REQUIRE(shape[d] >= 0);
            numel *= (uint64_t)shape[d];
        }
        FUZZ_REQUIRE(numel * sizeof(float) <= size);
        for (uint64_t k = 0; k < numel; k++) sink += p[k];
        float *dst = malloc(numel ? numel * sizeof(float) : 1);
        FUZZ_REQUIRE(loom_safetensors_read_into(f, name, dst, nd, shape, &err) == 0);
        if (numel) FUZZ_REQUIRE(memcmp(dst, p, numel * sizeof(float)) == 0);
        free(dst);
        int64_t wrong[8] = {(int64_t)numel + 1};
        FUZZ_REQUIRE(loom_safetensors_read_into(f, name, NULL, 1, wrong, &err) != 0);
    }
    (void)loom_safetensors_metadata(f, "format");
    (void)loom_safetensors_metadata(f, "");
    loom_safetensors_close(f);
    free(buf);
    (void)sink;
    return 0;
}
