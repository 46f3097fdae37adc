/* The Hugging Face pipeline around the BPE model, for tokenizer.json files that are not the
 * plain GPT-2 form: normalizers (NFC/NFD/NFKC/NFKD, Prepend, Replace, Sequence),
 * pre-tokenizers (ByteLevel, Split, Metaspace, Digits, Sequence) and decoders (ByteLevel,
 * Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence). Each step does what the
 * `tokenizers` step of the same name does (docs/tokenizers.md lists the cases); anything else
 * is refused at load time naming the file and the step. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include "data/bpe_internal.h"

#define MAX_STEPS 64

/* ---- a growable byte buffer --------------------------------------------------------------- */
typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void buf_put(buf *b, const void *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 64;
        while (c < b->n + n + 1) c *= 2;
        b->p = loom_realloc(b->p, c);
        b->cap = c;
    }
    if (n && s) memcpy(b->p + b->n, s, n);
    b->n += n;
}

/* replaces every non-overlapping occurrence of a (left to right) in s by r into out */
static void replace_all(const uint8_t *s, size_t n, const char *a, size_t al, const char *r, size_t rl, buf *out) {
    size_t i = 0, last = 0;
    while (al && i + al <= n) {
        if (s[i] == (uint8_t)a[0] && !memcmp(s + i, a, al)) {
            buf_put(out, s + last, i - last);
            buf_put(out, r, rl);
            i += al;
            last = i;
        } else {
            i++;
        }
    }
    buf_put(out, s + last, n - last);
}

/* ---- loading ------------------------------------------------------------------------------ */
static int get_str(const char *path, json_t *o, const char *where, const char *key, const char **s, size_t *n,
                   loom_err *err) {
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v))
        return loom_errf(err, "%s: %s.%s must be a string (without NUL characters)", path, where, key);
    *s = json_string_value(v);
    *n = json_string_length(v);
    return 0;
}

static char *dupn(const char *s, size_t n) {
    char *d = loom_malloc(n + 1);
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

/* a {"String": s} pattern (Replace steps); a Regex one is refused */
static int string_pattern(const char *path, json_t *o, const char *where, const char **s, size_t *n, loom_err *err) {
    json_t *p = json_object_get(o, "pattern");
    json_t *str = json_object_get(p, "String");
    if (json_is_object(p) && json_object_get(p, "Regex"))
        return loom_errf(err, "%s: %s has a Regex pattern; loom supports String patterns there", path, where);
    if (!json_is_string(str) || json_string_length(str) == 0 || strlen(json_string_value(str)) != json_string_length(str))
        return loom_errf(err, "%s: %s.pattern must be {\"String\": \"...\"} (non-empty)", path, where);
    *s = json_string_value(str);
    *n = json_string_length(str);
    return 0;
}

static const char *type_of(json_t *o) { return json_string_value(json_object_get(o, "type")); }

static int load_norm(loom_tokenizer *t, const char *path, json_t *o, int depth, loom_err *err) {
    const char *type = type_of(o);
    if (!json_is_object(o) || !type) return loom_errf(err, "%s: normalizer: each step must be an object with a \"type\"", path);
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(o, "normalizers");
        if (!json_is_array(list) || depth > 4) return loom_errf(err, "%s: normalizer Sequence needs a 'normalizers' list (nested at most 4 deep)", path);
        size_t i;
        json_t *x;
        json_array_foreach(list, i, x) if (load_norm(t, path, x, depth + 1, err)) return -1;
        return 0;
    }
    if (t->n_norm >= MAX_STEPS) return loom_errf(err, "%s: more than %d normalizer steps", path, MAX_STEPS);
    bpe_norm *s = &t->norm[t->n_norm];
    memset(s, 0, sizeof *s);
    static const char *const forms[] = {"NFC", "NFD", "NFKC", "NFKD"};
    for (int f = 0; f < 4; f++)
        if (!strcmp(type, forms[f])) {
            s->kind = NORM_NFC + f;
            t->n_norm++;
            return 0;
        }
    const char *a = NULL, *b = NULL;
    size_t al = 0, bl = 0;
    if (!strcmp(type, "Prepend")) {
        if (get_str(path, o, "normalizer Prepend", "prepend", &a, &al, err)) return -1;
        s->kind = NORM_PREPEND;
        s->a = dupn(a, al), s->al = al;
        t->n_norm++;
        return 0;
    }
    if (!strcmp(type, "Replace")) {
        if (string_pattern(path, o, "normalizer Replace", &a, &al, err) ||
            get_str(path, o, "normalizer Replace", "content", &b, &bl, err))
            return -1;
        s->kind = NORM_REPLACE;
        s->a = dupn(a, al), s->al = al;
        s->b = dupn(b, bl), s->bl = bl;
        t->n_norm++;
        return 0;
    }
    return loom_errf(err, "%s: normalizer '%s' is not supported (loom supports NFC, NFD, NFKC, NFKD, Prepend, "
                          "Replace with a String pattern, and Sequences of them)", path, type);
}

static int opt_bool(const char *path, json_t *o, const char *where, const char *key, int dflt, int *out, loom_err *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return 0;
    }
    if (!json_is_boolean(v)) return loom_errf(err, "%s: %s.%s must be true or false", path, where, key);
    *out = json_is_true(v);
    return 0;
}

static int prepend_scheme(const char *path, json_t *o, const char *where, int *out, loom_err *err) {
    json_t *ps = json_object_get(o, "prepend_scheme");
    if (ps && !json_is_null(ps)) {
        const char *v = json_string_value(ps);
        if (v && !strcmp(v, "always")) *out = PREPEND_ALWAYS;
        else if (v && !strcmp(v, "first")) *out = PREPEND_FIRST;
        else if (v && !strcmp(v, "never")) *out = PREPEND_NEVER;
        else return loom_errf(err, "%s: %s.prepend_scheme must be \"always\", \"first\" or \"never\"", path, where);
        return 0;
    }
    int aps; /* files before tokenizers 0.14: add_prefix_space (default true) */
    if (opt_bool(path, o, where, "add_prefix_space", 1, &aps, err)) return -1;
    *out = aps ? PREPEND_ALWAYS : PREPEND_NEVER;
    return 0;
}

static int one_char(const char *path, const char *where, const char *s, size_t n, char *dst, size_t *dl, loom_err *err) {
    uint32_t cp;
    if (n == 0 || n > 4 || bpe_utf8_len((const uint8_t *)s, n, &cp) != n)
        return loom_errf(err, "%s: %s must be exactly one character", path, where);
    memcpy(dst, s, n);
    dst[n] = 0;
    *dl = n;
    return 0;
}

/* Oniguruma (inside `tokenizers`) matches \s as the Unicode White_Space set; PCRE2's UCP \s
 * also matches U+180E. \s and \S outside classes, and \s inside them, are spelled out. */
static char *translate_regex(const char *re, size_t n) {
    buf b = {0};
    int in_class = 0;
    static const char ws[] = BPE_WS;
    for (size_t i = 0; i < n; i++) {
        char c = re[i];
        if (c == '\\' && i + 1 < n) {
            char d = re[i + 1];
            if (d == 's' && in_class) buf_put(&b, ws, strlen(ws));
            else if (d == 's') buf_put(&b, "[", 1), buf_put(&b, ws, strlen(ws)), buf_put(&b, "]", 1);
            else if (d == 'S' && !in_class) buf_put(&b, "[^", 2), buf_put(&b, ws, strlen(ws)), buf_put(&b, "]", 1);
            else buf_put(&b, re + i, 2);
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = 1;
            buf_put(&b, re + i, 1);
            /* a ']' right after '[' or '[^' is a literal */
            if (i + 1 < n && re[i + 1] == '^') buf_put(&b, re + ++i, 1);
            if (i + 1 < n && re[i + 1] == ']') buf_put(&b, re + ++i, 1);
            continue;
        }
        if (in_class && c == '[' && i + 1 < n && re[i + 1] == ':') { /* [:alpha:] */
            const char *e = strstr(re + i + 2, ":]");
            if (e && (size_t)(e - re) < n) {
                buf_put(&b, re + i, (size_t)(e + 2 - (re + i)));
                i = (size_t)(e + 1 - re);
                continue;
            }
        }
        if (in_class && c == ']') in_class = 0;
        buf_put(&b, re + i, 1);
    }
    buf_put(&b, "", 1);
    return (char *)b.p;
}

static int compile_split(bpe_pretok *s, const char *path, const char *pat, size_t n, int literal, loom_err *err) {
    int ec;
    PCRE2_SIZE eo;
    char *src = literal ? dupn(pat, n) : translate_regex(pat, n);
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP | PCRE2_MULTILINE);
    s->re = pcre2_compile((PCRE2_SPTR)src, literal ? n : PCRE2_ZERO_TERMINATED, opts, &ec, &eo, NULL);
    free(src);
    if (!s->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return loom_errf(err, "%s: pre_tokenizer Split pattern \"%.80s\" does not compile (at offset %zu): %s", path, pat,
                         (size_t)eo, (const char *)msg);
    }
    s->jit = pcre2_jit_compile(s->re, PCRE2_JIT_COMPLETE) == 0;
    return 0;
}

static int load_pt(loom_tokenizer *t, const char *path, json_t *o, int depth, loom_err *err) {
    const char *type = type_of(o);
    if (!json_is_object(o) || !type) return loom_errf(err, "%s: pre_tokenizer: each step must be an object with a \"type\"", path);
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(o, "pretokenizers");
        if (!json_is_array(list) || depth > 4) return loom_errf(err, "%s: pre_tokenizer Sequence needs a 'pretokenizers' list (nested at most 4 deep)", path);
        size_t i;
        json_t *x;
        json_array_foreach(list, i, x) if (load_pt(t, path, x, depth + 1, err)) return -1;
        return 0;
    }
    if (t->n_pt >= MAX_STEPS) return loom_errf(err, "%s: more than %d pre-tokenizer steps", path, MAX_STEPS);
    if (t->n_pt > 0 && t->pt[t->n_pt - 1].kind == PT_BYTELEVEL)
        return loom_errf(err, "%s: pre_tokenizer '%s' after ByteLevel is not supported (ByteLevel must be the last step)", path, type);
    bpe_pretok *s = &t->pt[t->n_pt];
    memset(s, 0, sizeof *s);
    if (!strcmp(type, "ByteLevel")) {
        s->kind = PT_BYTELEVEL;
        if (opt_bool(path, o, "pre_tokenizer ByteLevel", "add_prefix_space", 1, &s->add_prefix_space, err) ||
            opt_bool(path, o, "pre_tokenizer ByteLevel", "use_regex", 1, &s->use_regex, err))
            return -1;
    } else if (!strcmp(type, "Split")) {
        s->kind = PT_SPLIT;
        json_t *p = json_object_get(o, "pattern");
        json_t *rx = json_object_get(p, "Regex"), *str = json_object_get(p, "String");
        json_t *pv = rx ? rx : str;
        if (!json_is_object(p) || !json_is_string(pv) || json_string_length(pv) == 0 ||
            strlen(json_string_value(pv)) != json_string_length(pv))
            return loom_errf(err, "%s: pre_tokenizer Split.pattern must be {\"Regex\": ...} or {\"String\": ...} (non-empty)", path);
        const char *beh = json_string_value(json_object_get(o, "behavior"));
        static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
        s->behavior = -1;
        for (int b = 0; b < 5; b++)
            if (beh && !strcmp(beh, names[b])) s->behavior = b;
        if (s->behavior < 0)
            return loom_errf(err, "%s: pre_tokenizer Split.behavior '%s' is not one of Removed, Isolated, MergedWithPrevious, "
                                  "MergedWithNext, Contiguous", path, beh ? beh : "(missing)");
        if (opt_bool(path, o, "pre_tokenizer Split", "invert", 0, &s->invert, err)) return -1;
        t->n_pt++; /* counted before compiling, so that a failure frees nothing twice */
        return compile_split(s, path, json_string_value(pv), json_string_length(pv), rx == NULL, err);
    } else if (!strcmp(type, "Metaspace")) {
        s->kind = PT_METASPACE;
        const char *r = NULL;
        size_t rl = 0;
        if (get_str(path, o, "pre_tokenizer Metaspace", "replacement", &r, &rl, err) ||
            one_char(path, "pre_tokenizer Metaspace.replacement", r, rl, s->rep, &s->rep_len, err) ||
            prepend_scheme(path, o, "pre_tokenizer Metaspace", &s->prepend, err) ||
            opt_bool(path, o, "pre_tokenizer Metaspace", "split", 1, &s->split, err))
            return -1;
    } else if (!strcmp(type, "Digits")) {
        /* HF splits on char::is_numeric (the N categories): each alone, or runs of them */
        s->kind = PT_SPLIT;
        if (opt_bool(path, o, "pre_tokenizer Digits", "individual_digits", 0, &s->individual, err)) return -1;
        s->behavior = s->individual ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS;
        t->n_pt++;
        return compile_split(s, path, "\\p{N}", 5, 0, err);
    } else {
        return loom_errf(err, "%s: pre_tokenizer '%s' is not supported (loom supports ByteLevel, Split, Metaspace, Digits "
                              "and Sequences of them)", path, type);
    }
    t->n_pt++;
    return 0;
}

static int load_dec(loom_tokenizer *t, const char *path, json_t *o, int depth, int *fused, loom_err *err) {
    const char *type = type_of(o);
    if (!json_is_object(o) || !type) return loom_errf(err, "%s: decoder: each step must be an object with a \"type\"", path);
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(o, "decoders");
        if (!json_is_array(list) || depth > 4) return loom_errf(err, "%s: decoder Sequence needs a 'decoders' list (nested at most 4 deep)", path);
        size_t i;
        json_t *x;
        json_array_foreach(list, i, x) if (load_dec(t, path, x, depth + 1, fused, err)) return -1;
        return 0;
    }
    if (t->n_dec >= MAX_STEPS) return loom_errf(err, "%s: more than %d decoder steps", path, MAX_STEPS);
    bpe_dec *s = &t->dec[t->n_dec];
    memset(s, 0, sizeof *s);
    s->whole = *fused;
    const char *a = NULL, *b = NULL;
    size_t al = 0, bl = 0;
    if (*fused && strcmp(type, "Strip") && strcmp(type, "Fuse"))
        return loom_errf(err, "%s: decoder '%s' after Fuse is not supported (only Strip may follow Fuse)", path, type);
    if (!strcmp(type, "ByteLevel")) {
        s->kind = DEC_BYTELEVEL;
    } else if (!strcmp(type, "ByteFallback")) {
        s->kind = DEC_BYTEFALLBACK;
    } else if (!strcmp(type, "Fuse")) {
        s->kind = DEC_FUSE;
        *fused = 1;
    } else if (!strcmp(type, "Replace")) {
        if (string_pattern(path, o, "decoder Replace", &a, &al, err) || get_str(path, o, "decoder Replace", "content", &b, &bl, err))
            return -1;
        s->kind = DEC_REPLACE;
        s->a = dupn(a, al), s->al = al;
        s->b = dupn(b, bl), s->bl = bl;
    } else if (!strcmp(type, "Strip")) {
        s->kind = DEC_STRIP;
        json_t *st = json_object_get(o, "start"), *sp = json_object_get(o, "stop");
        char c[8];
        size_t cl = 0;
        if (get_str(path, o, "decoder Strip", "content", &a, &al, err) ||
            one_char(path, "decoder Strip.content", a, al, c, &cl, err))
            return -1;
        if (!json_is_integer(st) || !json_is_integer(sp) || json_integer_value(st) < 0 || json_integer_value(sp) < 0 ||
            json_integer_value(st) > 1024 || json_integer_value(sp) > 1024)
            return loom_errf(err, "%s: decoder Strip.start and .stop must be integers in [0, 1024]", path);
        s->a = dupn(c, cl), s->al = cl;
        s->start = (int)json_integer_value(st);
        s->stop = (int)json_integer_value(sp);
        if (s->whole) {
            if (t->strip_start || t->strip_stop) return loom_errf(err, "%s: more than one decoder Strip after Fuse", path);
            t->strip_start = s->start, t->strip_stop = s->stop;
            memcpy(t->strip_char, c, cl + 1);
            t->strip_char_len = cl;
        }
    } else if (!strcmp(type, "Metaspace")) {
        s->kind = DEC_METASPACE;
        char r[8];
        size_t rl = 0;
        if (get_str(path, o, "decoder Metaspace", "replacement", &a, &al, err) ||
            one_char(path, "decoder Metaspace.replacement", a, al, r, &rl, err) ||
            prepend_scheme(path, o, "decoder Metaspace", &s->prepend, err))
            return -1;
        s->a = dupn(r, rl), s->al = rl;
        if (s->prepend != PREPEND_NEVER) t->dec_meta_first = 1;
    } else {
        return loom_errf(err, "%s: decoder '%s' is not supported (loom supports ByteLevel, Replace, ByteFallback, Fuse, "
                              "Strip, Metaspace and Sequences of them)", path, type);
    }
    t->n_dec++;
    return 0;
}

static char *compact(json_t *v) {
    if (!v || json_is_null(v)) return NULL;
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    LOOM_CHECK(s != NULL);
    return s;
}

int bpe_pipeline_load(loom_tokenizer *t, const char *path, json_t *norm, json_t *pt, json_t *dec, loom_err *err) {
    if (norm && json_is_null(norm)) norm = NULL;
    if (pt && json_is_null(pt)) pt = NULL;
    if (dec && json_is_null(dec)) dec = NULL;
    const char *pty = json_is_object(pt) ? type_of(pt) : NULL, *dty = json_is_object(dec) ? type_of(dec) : NULL;
    if (!norm && pty && !strcmp(pty, "ByteLevel") && (!dec || (dty && !strcmp(dty, "ByteLevel")))) {
        /* the plain GPT-2 form: loom's original path, unchanged */
        if (opt_bool(path, pt, "pre_tokenizer", "add_prefix_space", 0, &t->add_prefix_space, err) ||
            opt_bool(path, pt, "pre_tokenizer", "use_regex", 1, &t->use_regex, err))
            return -1;
        return 0;
    }
    t->general = 1;
    t->norm = loom_calloc(MAX_STEPS, sizeof *t->norm);
    t->pt = loom_calloc(MAX_STEPS, sizeof *t->pt);
    t->dec = loom_calloc(MAX_STEPS, sizeof *t->dec);
    int fused = 0;
    if ((norm && load_norm(t, path, norm, 0, err)) || (pt && load_pt(t, path, pt, 0, err)) ||
        (dec && load_dec(t, path, dec, 0, &fused, err)))
        return -1;
    t->byte_level = t->n_pt > 0 && t->pt[t->n_pt - 1].kind == PT_BYTELEVEL;
    t->add_prefix_space = 0;
    t->use_regex = t->byte_level ? t->pt[t->n_pt - 1].use_regex : 0;
    for (int i = 0; i < t->n_norm; i++) /* checked here: ICU is needed only when used */
        if (t->norm[i].kind <= NORM_NFKD) {
            UErrorCode st = U_ZERO_ERROR;
            const UNormalizer2 *nz = t->norm[i].kind == NORM_NFC    ? unorm2_getNFCInstance(&st)
                                     : t->norm[i].kind == NORM_NFD  ? unorm2_getNFDInstance(&st)
                                     : t->norm[i].kind == NORM_NFKC ? unorm2_getNFKCInstance(&st)
                                                                    : unorm2_getNFKDInstance(&st);
            if (!nz || U_FAILURE(st)) return loom_errf(err, "%s: Unicode normalization is unavailable (ICU: %s)", path, u_errorName(st));
        }
    t->j_norm = compact(norm);
    t->j_pt = compact(pt);
    t->j_dec = compact(dec);
    return 0;
}

void bpe_pipeline_free(loom_tokenizer *t) {
    for (int i = 0; t->norm && i < t->n_norm; i++) free(t->norm[i].a), free(t->norm[i].b);
    for (int i = 0; t->pt && i < t->n_pt; i++)
        if (t->pt[i].re) pcre2_code_free(t->pt[i].re);
    for (int i = 0; t->dec && i < t->n_dec; i++) free(t->dec[i].a), free(t->dec[i].b);
    free(t->norm);
    free(t->pt);
    free(t->dec);
    free(t->j_norm);
    free(t->j_pt);
    free(t->j_dec);
}

/* ---- normalizers ------------------------------------------------------------------------- */
static const UNormalizer2 *icu_form(int kind) {
    UErrorCode st = U_ZERO_ERROR;
    switch (kind) {
    case NORM_NFC: return unorm2_getNFCInstance(&st);
    case NORM_NFD: return unorm2_getNFDInstance(&st);
    case NORM_NFKC: return unorm2_getNFKCInstance(&st);
    default: return unorm2_getNFKDInstance(&st);
    }
}

/* one valid UTF-8 run through ICU (UTF-16 both ways); 0 or -1 */
static int icu_run(int kind, const uint8_t *s, size_t n, buf *out, loom_err *err) {
    if (n > ((size_t)1 << 28)) return loom_errf(err, "tokenizer: a %zu-byte run is too long to normalize", n);
    UErrorCode st = U_ZERO_ERROR;
    int32_t u16n = 0;
    u_strFromUTF8(NULL, 0, &u16n, (const char *)s, (int32_t)n, &st);
    st = U_ZERO_ERROR;
    UChar *src = loom_malloc(((size_t)u16n + 1) * sizeof *src);
    u_strFromUTF8(src, u16n + 1, NULL, (const char *)s, (int32_t)n, &st);
    const UNormalizer2 *nz = icu_form(kind);
    int32_t cap = u16n * 3 + 16;
    UChar *dst = loom_malloc((size_t)cap * sizeof *dst);
    int32_t dn = 0;
    if (U_SUCCESS(st)) {
        dn = unorm2_normalize(nz, src, u16n, dst, cap, &st);
        if (st == U_BUFFER_OVERFLOW_ERROR) {
            st = U_ZERO_ERROR;
            cap = dn + 1;
            dst = loom_realloc(dst, (size_t)cap * sizeof *dst);
            dn = unorm2_normalize(nz, src, u16n, dst, cap, &st);
        }
    }
    int32_t bn = 0;
    if (U_SUCCESS(st)) {
        u_strToUTF8(NULL, 0, &bn, dst, dn, &st);
        if (st == U_BUFFER_OVERFLOW_ERROR) st = U_ZERO_ERROR;
    }
    if (U_SUCCESS(st)) {
        size_t at = out->n;
        buf_put(out, NULL, (size_t)bn + 1);
        u_strToUTF8((char *)out->p + at, bn + 1, NULL, dst, dn, &st);
        out->n = at + (size_t)bn;
    }
    free(src);
    free(dst);
    if (U_FAILURE(st)) return loom_errf(err, "tokenizer: Unicode normalization failed: %s", u_errorName(st));
    return 0;
}

/* Unicode normalization of the valid UTF-8 runs (invalid bytes are kept as they are). Runs
 * whose characters all lie below the first one the form can change are copied. */
static int unicode_form(int kind, const uint8_t *s, size_t n, buf *out, loom_err *err) {
    const uint32_t stable = kind == NORM_NFC ? 0x300 : 0x80;
    size_t i = 0;
    while (i < n) {
        size_t start = i, l;
        int simple = 1;
        uint32_t cp;
        while (i < n && (l = bpe_utf8_len(s + i, n - i, &cp)) != 0) {
            if (cp >= stable) simple = 0;
            i += l;
        }
        if (i > start) {
            if (simple) buf_put(out, s + start, i - start);
            else if (icu_run(kind, s + start, i - start, out, err)) return -1;
        }
        start = i;
        while (i < n && bpe_utf8_len(s + i, n - i, NULL) == 0) i++;
        buf_put(out, s + start, i - start);
    }
    return 0;
}

int bpe_normalize(const loom_tokenizer *t, const uint8_t *s, size_t n, int split_start, uint8_t **out,
                  size_t *out_len, loom_err *err) {
    *out = NULL;
    *out_len = n;
    if (t->n_norm == 0) return 0;
    buf cur = {0}, nxt = {0};
    const uint8_t *p = s;
    size_t pn = n;
    for (int k = 0; k < t->n_norm; k++) {
        const bpe_norm *st = &t->norm[k];
        nxt.n = 0;
        if (st->kind <= NORM_NFKD) {
            if (unicode_form(st->kind, p, pn, &nxt, err)) {
                free(cur.p);
                free(nxt.p);
                return -1;
            }
        } else if (st->kind == NORM_PREPEND) {
            if (pn && split_start) buf_put(&nxt, st->a, st->al);
            buf_put(&nxt, p, pn);
        } else {
            replace_all(p, pn, st->a, st->al, st->b, st->bl, &nxt);
        }
        buf tmp = cur;
        cur = nxt;
        nxt = tmp;
        p = cur.p ? cur.p : (const uint8_t *)"";
        pn = cur.n;
    }
    free(nxt.p);
    *out = cur.p ? cur.p : loom_malloc(1);
    *out_len = cur.n;
    return 0;
}

/* ---- pre-tokenizers ------------------------------------------------------------------------ */
typedef struct span {
    size_t a, b;
    int match;
} span;

typedef struct spans {
    span *v;
    size_t n, cap;
} spans;

static void spans_add(spans *s, size_t a, size_t b, int match) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->v = loom_realloc(s->v, s->cap * sizeof *s->v);
    }
    s->v[s->n++] = (span){a, b, match};
}

/* the regex's matches over s[0..n) (valid UTF-8) as alternating spans, HF's find_matches */
static int regex_spans(const bpe_pretok *st, pcre2_match_data *md, const uint8_t *s, size_t n, size_t base, spans *out,
                       loom_err *err) {
    size_t pos = 0, prev = 0;
    while (pos <= n) {
        int rc = st->jit ? pcre2_jit_match(st->re, s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL)
                         : pcre2_match(st->re, s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_HEAPLIMIT)
            rc = pcre2_match(st->re, s, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return loom_errf(err, "tokenizer: pre-tokenizer Split regex failed at byte %zu: %s", pos, (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t a = ov[0], b = ov[1];
        if (a > prev) spans_add(out, base + prev, base + a, 0);
        spans_add(out, base + a, base + b, 1);
        prev = b;
        if (b > a) {
            pos = b;
        } else { /* an empty match: the next search starts one character further */
            if (a >= n) break;
            size_t l = bpe_utf8_len(s + a, n - a, NULL);
            pos = a + (l ? l : 1);
        }
    }
    if (prev < n) spans_add(out, base + prev, base + n, 0);
    return 0;
}

/* character spans: each character for which pred holds is a match */
static void char_spans(const uint8_t *s, size_t n, size_t base, int (*pred)(const uint8_t *, size_t, const void *),
                       const void *arg, spans *out) {
    size_t i = 0;
    while (i < n) {
        size_t l = bpe_utf8_len(s + i, n - i, NULL);
        if (!l) l = 1;
        if (pred(s, i, arg)) spans_add(out, base + i, base + i + l, 1);
        else if (out->n && !out->v[out->n - 1].match && out->v[out->n - 1].b == base + i) out->v[out->n - 1].b += l;
        else spans_add(out, base + i, base + i + l, 0);
        i += l;
    }
}

typedef struct rep_arg {
    const char *rep;
    size_t len;
} rep_arg;

static int rep_pred(const uint8_t *s, size_t i, const void *arg) {
    const rep_arg *r = arg;
    return !memcmp(s + i, r->rep, r->len);
}

/* HF's SplitDelimiterBehavior applied to the spans, in place: the pieces to keep (match = 0
 * marks a kept piece after this). */
static void apply_behavior(spans *sp, int behavior, int invert) {
    if (invert)
        for (size_t i = 0; i < sp->n; i++) sp->v[i].match = !sp->v[i].match;
    size_t k = 0;
    int prev_match = 0;
    switch (behavior) {
    case SPLIT_ISOLATED:
        break;
    case SPLIT_REMOVED:
        for (size_t i = 0; i < sp->n; i++)
            if (!sp->v[i].match) sp->v[k++] = sp->v[i];
        sp->n = k;
        break;
    case SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < sp->n; i++) {
            if (sp->v[i].match == prev_match && k) sp->v[k - 1].b = sp->v[i].b;
            else sp->v[k++] = sp->v[i];
            prev_match = sp->v[i].match;
        }
        sp->n = k;
        break;
    case SPLIT_MERGED_PREV:
        for (size_t i = 0; i < sp->n; i++) {
            if (sp->v[i].match && !prev_match && k) sp->v[k - 1].b = sp->v[i].b;
            else sp->v[k++] = sp->v[i];
            prev_match = sp->v[i].match;
        }
        sp->n = k;
        break;
    case SPLIT_MERGED_NEXT: /* from the right: a match joins the piece after it */
        k = sp->n;
        for (size_t j = sp->n; j-- > 0;) {
            if (sp->v[j].match && !prev_match && k < sp->n) sp->v[k].a = sp->v[j].a;
            else sp->v[--k] = sp->v[j];
            prev_match = sp->v[j].match;
        }
        memmove(sp->v, sp->v + k, (sp->n - k) * sizeof *sp->v);
        sp->n -= k;
        break;
    }
}

static int emit_spans(const loom_tokenizer *t, pcre2_match_data *md, int k, const uint8_t *s, spans *sp, int at0,
                      int cont, bpe_piece_fn_t fn, void *ctx, loom_err *err) {
    for (size_t i = 0; i < sp->n; i++) {
        if (sp->v[i].b <= sp->v[i].a) continue;
        if (bpe_pretok_run(t, md, k, s + sp->v[i].a, sp->v[i].b - sp->v[i].a, at0 && sp->v[i].a == 0, cont, fn, ctx, err))
            return -1;
    }
    return 0;
}

int bpe_pretok_run(const loom_tokenizer *t, pcre2_match_data *md, int k, const uint8_t *s, size_t n, int at0, int cont,
                   bpe_piece_fn_t fn, void *ctx, loom_err *err) {
    if (n == 0) return 0;
    if (k == t->n_pt) {
        fn(ctx, s, n);
        return 0;
    }
    const bpe_pretok *st = &t->pt[k];
    const int prefix_ok = !(at0 && cont); /* a continued text's first piece is not a split start */
    int rc = 0;
    if (st->kind == PT_BYTELEVEL) { /* the last step: the pieces go to the model */
        if (st->add_prefix_space && s[0] != ' ' && prefix_ok) {
            uint8_t *tmp = loom_malloc(n + 1);
            tmp[0] = ' ';
            memcpy(tmp + 1, s, n);
            rc = bpe_pretokenize(t, md, tmp, n + 1, fn, ctx, err);
            free(tmp);
            return rc;
        }
        return bpe_pretokenize(t, md, s, n, fn, ctx, err);
    }
    spans sp = {0};
    if (st->kind == PT_SPLIT) {
        /* valid UTF-8 runs are matched; each invalid run is a piece of its own */
        size_t i = 0;
        while (i < n && !rc) {
            size_t start = i, l = 0;
            while (i < n && (s[i] < 0x80 || (l = bpe_utf8_len(s + i, n - i, NULL)) != 0)) i += s[i] < 0x80 ? 1 : l;
            if (i > start) {
                sp.n = 0;
                rc = regex_spans(st, md, s + start, i - start, start, &sp, err);
                if (!rc) apply_behavior(&sp, st->behavior, st->invert);
                if (!rc) rc = emit_spans(t, md, k + 1, s, &sp, at0, cont, fn, ctx, err);
            }
            start = i;
            while (i < n && s[i] >= 0x80 && bpe_utf8_len(s + i, n - i, NULL) == 0) i++;
            if (i > start && !rc) rc = bpe_pretok_run(t, md, k + 1, s + start, i - start, at0 && start == 0, cont, fn, ctx, err);
        }
    } else { /* Metaspace: spaces become the replacement, which may be prepended, then split */
        buf b = {0};
        int pre = 0;
        if (st->prepend == PREPEND_ALWAYS) pre = prefix_ok;
        else if (st->prepend == PREPEND_FIRST) pre = at0 && !cont;
        replace_all(s, n, " ", 1, st->rep, st->rep_len, &b);
        if (pre && !(b.n >= st->rep_len && !memcmp(b.p, st->rep, st->rep_len))) {
            buf c = {0};
            buf_put(&c, st->rep, st->rep_len);
            buf_put(&c, b.p, b.n);
            free(b.p);
            b = c;
        }
        if (st->split) {
            rep_arg ra = {st->rep, st->rep_len};
            char_spans(b.p, b.n, 0, rep_pred, &ra, &sp);
            apply_behavior(&sp, SPLIT_MERGED_NEXT, 0);
            rc = emit_spans(t, md, k + 1, b.p, &sp, at0, cont, fn, ctx, err);
        } else {
            rc = bpe_pretok_run(t, md, k + 1, b.p, b.n, at0, cont, fn, ctx, err);
        }
        free(b.p);
    }
    free(sp.v);
    return rc;
}

/* ---- decoders ------------------------------------------------------------------------------- */
static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

void bpe_decode_token(const loom_tokenizer *t, const char *s, size_t n, int first, char **out, size_t *out_len) {
    buf cur = {0}, nxt = {0};
    buf_put(&cur, s, n);
    for (int k = 0; k < t->n_dec; k++) {
        const bpe_dec *d = &t->dec[k];
        if (d->whole) break; /* after Fuse: whole-text steps (Strip), applied by the decode call */
        nxt.n = 0;
        switch (d->kind) {
        case DEC_BYTELEVEL: { /* every character in the byte alphabet -> its byte; else kept whole */
            size_t i = 0;
            int ok = 1;
            while (i < cur.n && ok) {
                uint32_t cp;
                size_t l = bpe_utf8_len(cur.p + i, cur.n - i, &cp);
                int b = l ? bpe_cp_to_byte(cp) : -1;
                if (b < 0) ok = 0;
                else {
                    uint8_t c = (uint8_t)b;
                    buf_put(&nxt, &c, 1);
                    i += l;
                }
            }
            if (!ok) nxt.n = 0, buf_put(&nxt, cur.p, cur.n);
            break;
        }
        case DEC_REPLACE:
            replace_all(cur.p, cur.n, d->a, d->al, d->b, d->bl, &nxt);
            break;
        case DEC_BYTEFALLBACK:
            if (cur.n == 6 && !memcmp(cur.p, "<0x", 3) && cur.p[5] == '>' && hexval((char)cur.p[3]) >= 0 &&
                hexval((char)cur.p[4]) >= 0) {
                uint8_t c = (uint8_t)(hexval((char)cur.p[3]) * 16 + hexval((char)cur.p[4]));
                buf_put(&nxt, &c, 1);
            } else {
                buf_put(&nxt, cur.p, cur.n);
            }
            break;
        case DEC_FUSE:
            buf_put(&nxt, cur.p, cur.n);
            break;
        case DEC_STRIP: { /* per token (before Fuse) */
            size_t a = 0, b = cur.n;
            for (int i = 0; i < d->start && a + d->al <= b && !memcmp(cur.p + a, d->a, d->al); i++) a += d->al;
            for (int i = 0; i < d->stop && b >= a + d->al && !memcmp(cur.p + b - d->al, d->a, d->al); i++) b -= d->al;
            buf_put(&nxt, cur.p + a, b - a);
            break;
        }
        case DEC_METASPACE:
            replace_all(cur.p, cur.n, d->a, d->al, first && d->prepend != PREPEND_NEVER ? "" : " ",
                        first && d->prepend != PREPEND_NEVER ? 0 : 1, &nxt);
            break;
        }
        buf tmp = cur;
        cur = nxt;
        nxt = tmp;
    }
    free(nxt.p);
    buf_put(&cur, "", 0);
    cur.p[cur.n] = 0;
    *out = (char *)cur.p;
    *out_len = cur.n;
}
