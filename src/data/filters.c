/* Processing steps that look at one document at a time: utf8_repair, length, regex; and the
 * step dispatcher with its before/after counts. Steps keep the order of the documents they
 * keep, and their result does not depend on the number of threads. */
#define _GNU_SOURCE
#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/build_source.h"

#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

/* Length of the valid UTF-8 sequence at p (1..4), or 0 when invalid; *sub = the length of
 * the maximal valid prefix of an invalid sequence (>= 1), which one U+FFFD replaces. */
static int utf8_seq(const uint8_t *p, size_t n, int *sub) {
    uint8_t b = p[0];
    *sub = 1;
    if (b < 0x80) return 1;
    int need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) need = 1;
    else if (b == 0xE0) need = 2, lo = 0xA0;
    else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) need = 2;
    else if (b == 0xED) need = 2, hi = 0x9F;
    else if (b == 0xF0) need = 3, lo = 0x90;
    else if (b >= 0xF1 && b <= 0xF3) need = 3;
    else if (b == 0xF4) need = 3, hi = 0x8F;
    else return 0;
    for (int k = 1; k <= need; k++) {
        if ((size_t)k >= n) {
            *sub = k;
            return 0;
        }
        uint8_t c = p[k];
        uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (c < l || c > h) {
            *sub = k;
            return 0;
        }
    }
    return need + 1;
}

int loom_utf8_valid(const uint8_t *p, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        int sub, k = utf8_seq(p + i, n - i, &sub);
        if (!k) return 0;
        i += (size_t)k;
    }
    return 1;
}

size_t loom_utf8_repair(const uint8_t *p, size_t n, uint8_t *out) {
    size_t i = 0, o = 0;
    while (i < n) {
        int sub, k = utf8_seq(p + i, n - i, &sub);
        if (k) {
            if (out) memcpy(out + o, p + i, (size_t)k);
            o += (size_t)k;
            i += (size_t)k;
        } else {
            if (out) out[o] = 0xEF, out[o + 1] = 0xBF, out[o + 2] = 0xBD;
            o += 3;
            i += (size_t)sub;
        }
    }
    return o;
}

/* keep the documents with keep[i] != 0, in order */
static void compact(loom_docs *d, const uint8_t *keep) {
    size_t w = 0;
    for (size_t i = 0; i < d->n; i++)
        if (keep[i]) d->v[w++] = d->v[i];
    d->n = w;
}

static void step_utf8(loom_docs *d, loom_step_count *c) {
    size_t n = d->n;
    uint8_t *bad = loom_calloc(n ? n : 1, 1);
    #pragma omp parallel for schedule(dynamic, 64)
    for (size_t i = 0; i < n; i++) bad[i] = !loom_utf8_valid(loom_doc_bytes(d, i), d->v[i].len);
    for (size_t i = 0; i < n; i++) {
        if (!bad[i]) continue;
        size_t len = d->v[i].len, m = loom_utf8_repair(loom_doc_bytes(d, i), len, NULL);
        uint8_t *tmp = loom_malloc(m ? m : 1);
        loom_utf8_repair(loom_doc_bytes(d, i), len, tmp);
        d->v[i].off = loom_docs_put(d, tmp, m);
        d->v[i].len = m;
        free(tmp);
        c->changed++;
    }
    free(bad);
}

static void step_length(loom_docs *d, const loom_recipe_step *st) {
    uint8_t *keep = loom_malloc(d->n ? d->n : 1);
    for (size_t i = 0; i < d->n; i++)
        keep[i] = (int64_t)d->v[i].len >= st->min_bytes && (int64_t)d->v[i].len <= st->max_bytes;
    compact(d, keep);
    free(keep);
}

/* 1 match, 0 no match, -1 error (resource limits: reported) */
static int re_match(const pcre2_code *re, const uint8_t *p, size_t n, pcre2_match_data *md) {
    int rc = pcre2_match(re, (PCRE2_SPTR)p, n, 0, 0, md, NULL);
    if (rc >= 0) return 1;
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    return -1;
}

static int step_regex(loom_docs *d, const loom_recipe_step *st, loom_err *err) {
    size_t n = d->n;
    uint8_t *keep = loom_malloc(n ? n : 1);
    long long bad_doc = -1;
    int bad_code = 0;
    #pragma omp parallel
    {
        pcre2_match_data *mi = st->include_re
            ? pcre2_match_data_create_from_pattern((pcre2_code *)st->include_re, NULL) : NULL;
        pcre2_match_data *me = st->exclude_re
            ? pcre2_match_data_create_from_pattern((pcre2_code *)st->exclude_re, NULL) : NULL;
        #pragma omp for schedule(dynamic, 64)
        for (size_t i = 0; i < n; i++) {
            const uint8_t *p = loom_doc_bytes(d, i);
            size_t len = d->v[i].len;
            int k = 1;
            if (st->include_re) {
                int m = re_match(st->include_re, p, len, mi);
                if (m < 0) {
                    #pragma omp critical(loom_regex_err)
                    if (bad_doc < 0 || (long long)i < bad_doc) bad_doc = (long long)i, bad_code = 1;
                }
                k = m == 1;
            }
            if (k && st->exclude_re) {
                int m = re_match(st->exclude_re, p, len, me);
                if (m < 0) {
                    #pragma omp critical(loom_regex_err)
                    if (bad_doc < 0 || (long long)i < bad_doc) bad_doc = (long long)i, bad_code = 2;
                }
                k = m == 0;
            }
            keep[i] = (uint8_t)k;
        }
        pcre2_match_data_free(mi);
        pcre2_match_data_free(me);
    }
    if (bad_doc >= 0) {
        free(keep);
        return loom_errf(err, "regex '%s' failed on document %lld (match limit or resource error)",
                         bad_code == 1 ? st->include : st->exclude, bad_doc);
    }
    compact(d, keep);
    free(keep);
    return 0;
}

static uint64_t total_bytes(const loom_docs *d) {
    uint64_t b = 0;
    for (size_t i = 0; i < d->n; i++) b += d->v[i].len;
    return b;
}

int loom_step_run(const loom_recipe_step *st, int is_text, loom_docs *docs, loom_hashset *global,
                  loom_step_count *count, loom_err *err) {
    memset(count, 0, sizeof *count);
    count->step = loom_step_name(st->kind);
    count->docs_in = docs->n;
    count->bytes_in = total_bytes(docs);
    uint8_t *keep = NULL;
    switch (st->kind) {
    case LOOM_STEP_UTF8_REPAIR:
        step_utf8(docs, count);
        break;
    case LOOM_STEP_LENGTH:
        step_length(docs, st);
        break;
    case LOOM_STEP_REGEX:
        if (step_regex(docs, st, err) != 0) return -1;
        break;
    case LOOM_STEP_DEDUP_EXACT: {
        keep = loom_malloc(docs->n ? docs->n : 1);
        loom_hashset *local = global ? global : loom_hashset_new();
        loom_exact_dedup(docs, local, keep);
        if (!global) loom_hashset_free(local);
        compact(docs, keep);
        break;
    }
    case LOOM_STEP_DEDUP_NEAR:
        keep = loom_malloc(docs->n ? docs->n : 1);
        loom_near_dedup(docs, st->num_perm, st->bands, st->shingle, st->threshold, is_text, keep);
        compact(docs, keep);
        break;
    }
    free(keep);
    count->docs_out = docs->n;
    count->bytes_out = total_bytes(docs);
    return 0;
}
