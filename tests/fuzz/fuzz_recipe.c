/* Fuzz target: loom_recipe_load (src/data/recipe.h) on the bytes as a recipe YAML: sources,
 * steps (PCRE2 patterns are compiled), tokenizer, output. Parsing only, nothing is built. */
#include "fuzz_common.h"
#include "data/recipe.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (256u << 10)) return 0;
    char path[600];
    fuzz_path(path, sizeof path, "recipe.yaml");
    fuzz_write(path, data, size);
    loom_recipe r;
    loom_err err;
    if (loom_recipe_load(path, &r, &err) != 0) {
        FUZZ_REQUIRE(err.msg[0] != 0);
        loom_recipe_free(&r);
        return 0;
    }
    FUZZ_REQUIRE(r.n_sources >= 0 && r.text_len == size);
    for (int i = 0; i < r.n_sources; i++) {
        const loom_recipe_source *s = &r.sources[i];
        FUZZ_REQUIRE(s->name != NULL && s->path != NULL && s->weight > 0 && s->repeat_cap >= 0);
        for (int k = 0; k < s->n_steps; k++) FUZZ_REQUIRE(loom_step_name(s->steps[k].kind) != NULL);
    }
    loom_recipe_free(&r);
    return 0;
}
