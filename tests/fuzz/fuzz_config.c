/* Fuzz target: the config tree (include/loom/config.h). The bytes are YAML text for
 * loom_config_load_string; its first line is also tried as a `--set` assignment. A tree that
 * loads is read through every typed getter, then written with loom_config_to_yaml and loaded
 * back: the documented round trip must give the same keys and values, typed the same way (a
 * quoted "10" stays a string, a plain 10 an integer). */
#include "fuzz_common.h"
#include "loom/config.h"

/* Well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF), as YAML needs. */
static int utf8_ok(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        size_t len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
        if (!len || i + len > n || (len == 2 && c < 0xc2) || (len == 4 && c > 0xf4)) return 0;
        for (size_t k = 1; k < len; k++)
            if ((s[i + k] & 0xc0) != 0x80) return 0;
        if (len == 3 && ((c == 0xe0 && s[i + 1] < 0xa0) || (c == 0xed && s[i + 1] >= 0xa0))) return 0;
        if (len == 4 && ((c == 0xf0 && s[i + 1] < 0x90) || (c == 0xf4 && s[i + 1] >= 0x90))) return 0;
        i += len;
    }
    return 1;
}

static void read_all(const loom_config *c) {
    loom_err err;
    for (int i = 0; i < loom_config_count(c); i++) {
        const char *k = loom_config_key_at(c, i);
        FUZZ_REQUIRE(k != NULL && loom_config_value_at(c, i) != NULL);
        FUZZ_REQUIRE(loom_config_get(c, k) == loom_config_value_at(c, i));
        (void)loom_config_origin(c, k);
        int64_t iv;
        double dv;
        int bv;
        const char *sv;
        (void)loom_config_get_int(c, k, &iv, &err);
        (void)loom_config_get_double(c, k, &dv, &err);
        (void)loom_config_get_bool(c, k, &bv, &err);
        FUZZ_REQUIRE(loom_config_get_str(c, k, &sv, &err) == 0);
        char **items = NULL;
        int n = 0;
        if (loom_config_get_list(c, k, &items, &n, &err) == 0) loom_config_free_list(items, n);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (256u << 10)) return 0;
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = 0;
    loom_err err;
    loom_config *c = loom_config_new();
    if (loom_config_load_string(c, text, "fuzz.yaml", &err) != 0) {
        FUZZ_REQUIRE(err.msg[0] != 0);
        loom_config_free(c);
        c = loom_config_new();
    }
    /* The first line as --set. Its key is not parsed as YAML, so it may hold any bytes; the
     * CLI rejects keys outside the schema before a config is written, and a YAML file must
     * be UTF-8, so the round trip below is only promised for UTF-8 keys. */
    char *nl = strchr(text, '\n');
    if (nl) *nl = 0;
    const char *eq = strchr(text, '=');
    if (eq && utf8_ok((const unsigned char *)text, (size_t)(eq - text)))
        (void)loom_config_set_arg(c, text, &err);
    free(text);

    read_all(c);
    char *yaml = loom_config_to_yaml(c);
    FUZZ_REQUIRE(yaml != NULL);
    loom_config *back = loom_config_new();
    if (loom_config_load_string(back, yaml, "round-trip", &err) != 0) {
        fprintf(stderr, "fuzz: the written config does not load back: %s\n---\n%s---\n", err.msg, yaml);
        abort();
    }
    FUZZ_REQUIRE(loom_config_count(back) == loom_config_count(c));
    for (int i = 0; i < loom_config_count(c); i++) {
        if (strcmp(loom_config_key_at(c, i), loom_config_key_at(back, i)) != 0 ||
            strcmp(loom_config_value_at(c, i), loom_config_value_at(back, i)) != 0) {
            fprintf(stderr, "fuzz: round trip changed '%s' = '%s' into '%s' = '%s'\n---\n%s---\n",
                    loom_config_key_at(c, i), loom_config_value_at(c, i),
                    loom_config_key_at(back, i), loom_config_value_at(back, i), yaml);
            abort();
        }
        const char *k = loom_config_key_at(c, i);
        int64_t i1 = 0, i2 = 0;
        double d1 = 0, d2 = 0;
        int b1 = 0, b2 = 0;
        loom_err e;
        int ri = loom_config_get_int(c, k, &i1, &e), rd = loom_config_get_double(c, k, &d1, &e),
            rb = loom_config_get_bool(c, k, &b1, &e);
        if (ri != loom_config_get_int(back, k, &i2, &e) || i1 != i2 ||
            rd != loom_config_get_double(back, k, &d2, &e) || d1 != d2 ||
            rb != loom_config_get_bool(back, k, &b2, &e) || b1 != b2) {
            fprintf(stderr, "fuzz: round trip changed the type of '%s' = '%s'\n---\n%s---\n", k,
                    loom_config_value_at(c, i), yaml);
            abort();
        }
    }
    free(yaml);
    loom_config_free(back);
    loom_config_free(c);
    return 0;
}
