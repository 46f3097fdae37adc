/* Fuzz target: loom_dataset_open (include/loom/data.h) on a directory whose manifest.jsonl
 * is the bytes. The directory also holds two valid shards, a.bin and b.bin (the fixture of
 * fuzz_common.h; the seeds list them with their real SHA-256, so mutations reach the counts,
 * weights and repeat caps). A dataset that opens is read through a loader (mixing by weight,
 * caps), whose saved state must restore to the same next batch. */
#include "fuzz_common.h"

static char dir[600], mpath[700];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    char p[700];
    fuzz_path(dir, sizeof dir, "dataset");
    loom_err err;
    if (loom_mkdirs(dir, &err) != 0) abort();
    fuzz_fixture_shard(loom_pathf(p, sizeof p, "%s/a.bin", dir));
    fuzz_fixture_shard(loom_pathf(p, sizeof p, "%s/b.bin", dir));
    loom_pathf(mpath, sizeof mpath, "%s/manifest.jsonl", dir);
    return 0;
}

enum { T = 8, B = 3 };

static void use_loader(loom_dataset *d) {
    loom_err err;
    loom_loader *l = NULL, *r = NULL;
    if (loom_loader_create(d, T, 7, 1, &l, &err) != 0) return;
    int32_t in[B * T], tg[B * T], in2[B * T], tg2[B * T];
    const uint32_t vocab = loom_dataset_vocab_size(d);
    int ok = 1;
    for (int step = 0; step < 4 && ok; step++) {
        ok = loom_loader_next(l, B, in, tg, &err) == 0;
        for (int i = 0; ok && i < B * T; i++)
            FUZZ_REQUIRE(in[i] >= 0 && (uint32_t)in[i] < vocab && tg[i] >= 0 && (uint32_t)tg[i] < vocab);
    }
    if (ok) {
        char *state = loom_loader_state_json(l);
        FUZZ_REQUIRE(state != NULL);
        FUZZ_REQUIRE(loom_loader_create(d, T, 7, 1, &r, &err) == 0);
        if (loom_loader_restore_json(r, state, &err) != 0) {
            fprintf(stderr, "fuzz: a saved loader state does not restore: %s\n%s\n", err.msg, state);
            abort();
        }
        int a = loom_loader_next(l, B, in, tg, &err), b = loom_loader_next(r, B, in2, tg2, &err);
        FUZZ_REQUIRE(a == b);
        if (a == 0) FUZZ_REQUIRE(!memcmp(in, in2, sizeof in) && !memcmp(tg, tg2, sizeof tg));
        free(state);
    }
    for (int i = 0; i < loom_loader_num_sources(l); i++) {
        uint64_t consumed, epoch;
        FUZZ_REQUIRE(loom_loader_source(l, i, &consumed, &epoch) != NULL);
    }
    loom_loader_free(r);
    loom_loader_free(l);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (64u << 10)) return 0;
    fuzz_write(mpath, data, size);
    loom_dataset *d = NULL;
    loom_err err;
    if (loom_dataset_open(dir, &d, &err) != 0) {
        FUZZ_REQUIRE(d == NULL && err.msg[0] != 0);
        return 0;
    }
    uint64_t total = 0;
    for (int i = 0; i < loom_dataset_num_shards(d); i++)
        total += loom_shard_num_tokens(loom_dataset_shard(d, i));
    FUZZ_REQUIRE(total == loom_dataset_num_tokens(d));
    use_loader(d);
    loom_dataset_close(d);
    return 0;
}
