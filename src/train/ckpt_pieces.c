/* Checkpoint pieces: serialize what a rank owns, fill what a rank needs. */
#include "loom/ckpt_pieces.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static const char *KIND_NAMES[3] = {"param", "adam_m", "adam_v"};

void loom_pieces_file_name(int rank, char *buf, size_t size) {
    loom_pathf(buf, size, "rank_%05d.safetensors", rank);
}

static int is_piece_file(const char *name) {
    size_t n = strlen(name);
    return strncmp(name, "rank_", 5) == 0 && n > 17 && strcmp(name + n - 12, ".safetensors") == 0;
}

int loom_pieces_serialize(const loom_dp_piece *p, int n, char **buf, size_t *len, loom_err *err) {
    loom_st_tensor *t = loom_calloc((size_t)n + 1, sizeof *t);
    char **names = loom_calloc((size_t)n + 1, sizeof *names);
    /* metadata: format + one shape per distinct tensor */
    const char **meta = loom_calloc(2 * (size_t)n + 4, sizeof *meta);
    char **meta_own = loom_calloc(2 * (size_t)n + 4, sizeof *meta_own);
    int nm = 0, nown = 0;
    meta[nm++] = "format";
    meta[nm++] = "loom-pieces-1";
    for (int i = 0; i < n; i++) {
        char tmp[160];
        snprintf(tmp, sizeof tmp, "%s/%s/%zu", KIND_NAMES[p[i].kind], p[i].tensor->name, p[i].begin);
        names[i] = loom_strdup(tmp);
        t[i].name = names[i];
        t[i].data = p[i].data;
        t[i].ndim = 1;
        t[i].shape[0] = (int64_t)p[i].count;
        int seen = 0;
        for (int j = 0; j < i && !seen; j++) seen = p[j].tensor == p[i].tensor;
        if (seen) continue;
        const loom_tensor_info *ti = p[i].tensor;
        char key[96], val[96];
        snprintf(key, sizeof key, "shape/%s", ti->name);
        if (ti->ndim == 1) snprintf(val, sizeof val, "[%" PRId64 "]", ti->shape[0]);
        else snprintf(val, sizeof val, "[%" PRId64 ", %" PRId64 "]", ti->shape[0], ti->shape[1]);
        meta[nm++] = meta_own[nown++] = loom_strdup(key);
        meta[nm++] = meta_own[nown++] = loom_strdup(val);
    }
    meta[nm] = NULL;
    int rc = loom_safetensors_serialize(t, n, meta, buf, len, err);
    for (int i = 0; i < n; i++) free(names[i]);
    for (int i = 0; i < nown; i++) free(meta_own[i]);
    free(names);
    free(meta_own);
    free(meta);
    free(t);
    return rc;
}

/* one source piece found in a file */
typedef struct src_piece {
    int kind;
    char tensor[64];
    uint64_t begin, count;
    const float *data;
    const char *file;
} src_piece;

static int cmp_src(const void *a, const void *b) {
    const src_piece *x = a, *y = b;
    if (x->kind != y->kind) return x->kind - y->kind;
    int c = strcmp(x->tensor, y->tensor);
    if (c) return c;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* "<kind>/<tensor>/<begin>" */
static int parse_piece_name(const char *name, int *kind, char *tensor, size_t tsize,
                            uint64_t *begin) {
    const char *a = strchr(name, '/');
    const char *b = a ? strrchr(name, '/') : NULL;
    if (!a || b == a) return -1;
    *kind = -1;
    for (int k = 0; k < 3; k++)
        if ((size_t)(a - name) == strlen(KIND_NAMES[k]) && !strncmp(name, KIND_NAMES[k], (size_t)(a - name)))
            *kind = k;
    if (*kind < 0 || (size_t)(b - a - 1) >= tsize || b == a + 1) return -1;
    memcpy(tensor, a + 1, (size_t)(b - a - 1));
    tensor[b - a - 1] = 0;
    const char *d = b + 1;
    if (!*d) return -1;
    uint64_t v = 0;
    for (; *d; d++) {
        if (*d < '0' || *d > '9' || v > (UINT64_MAX - 9) / 10) return -1;
        v = v * 10 + (uint64_t)(*d - '0');
    }
    *begin = v;
    return 0;
}

/* "[a]" or "[a, b]" matches the shape */
static int shape_matches(const char *s, int ndim, const int64_t *shape) {
    char want[96];
    if (ndim == 1) snprintf(want, sizeof want, "[%" PRId64 "]", shape[0]);
    else snprintf(want, sizeof want, "[%" PRId64 ", %" PRId64 "]", shape[0], shape[1]);
    return s && strcmp(s, want) == 0;
}

int loom_pieces_fill(const loom_ckpt *ck, loom_dp_piece *needed, int n, loom_err *err) {
    const int nf = loom_ckpt_num_files(ck);
    loom_st_file **files = loom_calloc((size_t)nf + 1, sizeof *files);
    src_piece *src = NULL;
    size_t nsrc = 0, cap = 0;
    uint64_t *covered = loom_calloc((size_t)n + 1, sizeof *covered);
    int rc = -1, any = 0;
    char where[4400];
    for (int f = 0; f < nf; f++) {
        const char *fname = loom_ckpt_file_name(ck, f);
        if (!is_piece_file(fname)) continue;
        any = 1;
        size_t len;
        const char *buf = loom_ckpt_file_data(ck, fname, &len);
        loom_pathf(where, sizeof where, "%s/%s", loom_ckpt_dir(ck), fname);
        if (loom_safetensors_parse(buf, len, where, &files[f], err)) goto done;
        const char *fmt = loom_safetensors_metadata(files[f], "format");
        if (!fmt || strcmp(fmt, "loom-pieces-1") != 0) {
            loom_errf(err, "%s: not a loom piece file (metadata format = %s)", where, fmt ? fmt : "absent");
            goto done;
        }
        for (int i = 0; i < loom_safetensors_count(files[f]); i++) {
            src_piece sp = {.file = fname};
            const char *name = loom_safetensors_name(files[f], i);
            if (parse_piece_name(name, &sp.kind, sp.tensor, sizeof sp.tensor, &sp.begin)) {
                loom_errf(err, "%s: tensor '%.100s' is not named <kind>/<tensor>/<begin>", where, name);
                goto done;
            }
            int nd;
            int64_t shape[8];
            if (loom_safetensors_get(files[f], name, &sp.data, &nd, shape, err)) goto done;
            if (nd != 1) {
                loom_errf(err, "%s: piece '%.100s' is not 1-D", where, name);
                goto done;
            }
            sp.count = (uint64_t)shape[0];
            if (nsrc == cap) {
                cap = cap ? 2 * cap : 256;
                src = loom_realloc(src, cap * sizeof *src);
            }
            src[nsrc++] = sp;
        }
    }
    if (!any) {
        loom_errf(err, "%s: checkpoint has no rank_*.safetensors piece files", loom_ckpt_dir(ck));
        goto done;
    }
    qsort(src, nsrc, sizeof *src, cmp_src);
    for (size_t i = 1; i < nsrc; i++)
        if (src[i].kind == src[i - 1].kind && !strcmp(src[i].tensor, src[i - 1].tensor) &&
            src[i].begin < src[i - 1].begin + src[i - 1].count) {
            loom_errf(err, "%s: pieces of %s '%s' overlap (in %s and %s)", loom_ckpt_dir(ck),
                      KIND_NAMES[src[i].kind], src[i].tensor, src[i - 1].file, src[i].file);
            goto done;
        }
    for (int k = 0; k < n; k++) {
        loom_dp_piece *p = &needed[k];
        const loom_tensor_info *t = p->tensor;
        /* a tensor of its own name, else (a checkpoint of the fused format) its range of the
         * fused tensor: q_w/k_w/v_w in qkv_w, gate_w/up_w in llama's fc_w */
        int found_own = 0;
        for (size_t i = 0; i < nsrc && !found_own; i++)
            found_own = src[i].kind == p->kind && !strcmp(src[i].tensor, t->name);
        const int legacy = !found_own && t->legacy_name[0];
        const char *want = legacy ? t->legacy_name : t->name;
        const int want_ndim = legacy ? t->legacy_ndim : t->ndim;
        const int64_t *want_shape = legacy ? t->legacy_shape : t->shape;
        const uint64_t shift = legacy ? t->legacy_off : 0;   /* want's index of t's element 0 */
        const uint64_t want_numel = (uint64_t)want_shape[0] * (uint64_t)(want_ndim > 1 ? want_shape[1] : 1);
        for (size_t i = 0; i < nsrc; i++) {
            const src_piece *s = &src[i];
            if (s->kind != p->kind || strcmp(s->tensor, want) != 0) continue;
            /* the recorded shape and the piece's bounds, checked once per use */
            const loom_st_file *sf = NULL;
            for (int f = 0; f < nf && !sf; f++)
                if (files[f] && !strcmp(loom_ckpt_file_name(ck, f), s->file)) sf = files[f];
            char key[96];
            snprintf(key, sizeof key, "shape/%s", want);
            if (!shape_matches(loom_safetensors_metadata(sf, key), want_ndim, want_shape)) {
                loom_errf(err, "%s/%s: tensor '%s' has shape %s in the checkpoint, the model "
                               "wants another (is this the same model config?)",
                          loom_ckpt_dir(ck), s->file, want,
                          loom_safetensors_metadata(sf, key) ? loom_safetensors_metadata(sf, key) : "(none)");
                goto done;
            }
            if (s->begin > want_numel || s->count > want_numel - s->begin) {
                loom_errf(err, "%s/%s: piece %s/%s/%" PRIu64 " of %" PRIu64 " elements runs past "
                               "the tensor's %" PRIu64, loom_ckpt_dir(ck), s->file, KIND_NAMES[s->kind],
                          s->tensor, s->begin, s->count, want_numel);
                goto done;
            }
            /* in want's element indices */
            const uint64_t pb = shift + p->begin, pe = pb + p->count;
            const uint64_t lo = s->begin > pb ? s->begin : pb;
            const uint64_t hi = s->begin + s->count < pe ? s->begin + s->count : pe;
            if (lo >= hi) continue;
            memcpy(p->data + (lo - pb), s->data + (lo - s->begin), (hi - lo) * sizeof(float));
            covered[k] += hi - lo;
        }
        if (covered[k] != p->count) {
            loom_errf(err, "%s: the checkpoint holds %" PRIu64 " of the %zu elements of %s '%s' "
                           "this rank needs", loom_ckpt_dir(ck), covered[k], p->count,
                      KIND_NAMES[p->kind], t->name);
            goto done;
        }
    }
    rc = 0;
done:
    for (int f = 0; f < nf; f++) loom_safetensors_close(files[f]);
    free(files);
    free(src);
    free(covered);
    return rc;
}

int loom_pieces_load_params(const loom_ckpt *ck, loom_model *m, loom_err *err) {
    const int nt = loom_model_num_tensors(m);
    loom_dp_piece *need = loom_calloc((size_t)nt, sizeof *need);
    for (int i = 0; i < nt; i++) {
        const loom_tensor_info *t = loom_model_tensor(m, i);
        need[i] = (loom_dp_piece){0, t, 0, t->numel, loom_model_params(m) + t->offset};
    }
    int rc = loom_pieces_fill(ck, need, nt, err);
    free(need);
    return rc;
}
