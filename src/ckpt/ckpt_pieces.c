/* Checkpoint pieces: serialize what a rank owns, fill what a rank needs. A piece on disk is a
 * box of one global tensor (offset and extent per dimension); what a rank owns or needs is a
 * flat range of its own box of each tensor (a ZeRO slice of a tensor-parallel box, say), cut
 * into at most 2 * ndim - 1 boxes of the global tensor. */
#include "loom/backend.h"
#include "loom/ckpt_pieces.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static const char *KIND_NAMES[3] = {"param", "adam_m", "adam_v"};
#define FORMAT_V1 "loom-pieces-1" /* flat ranges of whole tensors: read only */
#define FORMAT_V2 "loom-pieces-2" /* boxes */
#define MAXD 4

void loom_pieces_file_name(int rank, char *buf, size_t size) {
    loom_pathf(buf, size, "rank_%05d.safetensors", rank);
}

int loom_pieces_is_file(const char *name) {
    size_t n = strlen(name);
    return strncmp(name, "rank_", 5) == 0 && n > 17 && strcmp(name + n - 12, ".safetensors") == 0;
}

/* ---- boxes ------------------------------------------------------------------------------ */

/* a box of a global tensor, with where its first element sits in some flat buffer */
typedef struct box {
    int64_t off[MAXD], len[MAXD];
    int64_t start; /* flat index of the box's first element in the range being cut */
} box;

static int64_t volume(int ndim, const int64_t *len) {
    int64_t v = 1;
    for (int d = 0; d < ndim; d++) v *= len[d];
    return v;
}

/* Cuts elements [b, e) (row-major over dims d..ndim-1 of the box (off, len), whose element 0
 * is flat index base) into boxes appended to out; dims < d of tmpl are already fixed. */
static int cut(int ndim, const int64_t *off, const int64_t *len, int d, box tmpl, int64_t b,
               int64_t e, int64_t base, box *out, int n) {
    if (b >= e) return n;
    if (d == ndim - 1) {
        tmpl.off[d] = off[d] + b;
        tmpl.len[d] = e - b;
        tmpl.start = base + b;
        out[n++] = tmpl;
        return n;
    }
    const int64_t inner = volume(ndim - d - 1, len + d + 1);
    int64_t r = b / inner;
    if (b % inner != 0) { /* a partial first row */
        const int64_t stop = e < (r + 1) * inner ? e : (r + 1) * inner;
        box t = tmpl;
        t.off[d] = off[d] + r;
        t.len[d] = 1;
        n = cut(ndim, off, len, d + 1, t, b - r * inner, stop - r * inner, base + r * inner, out, n);
        b = stop;
        r++;
    }
    const int64_t full = (e - b) / inner;
    if (b < e && full > 0) { /* whole rows: one box */
        box t = tmpl;
        t.off[d] = off[d] + r;
        t.len[d] = full;
        for (int k = d + 1; k < ndim; k++) {
            t.off[k] = off[k];
            t.len[k] = len[k];
        }
        t.start = base + b;
        out[n++] = t;
        b += full * inner;
        r += full;
    }
    if (b < e) { /* a partial last row */
        box t = tmpl;
        t.off[d] = off[d] + r;
        t.len[d] = 1;
        n = cut(ndim, off, len, d + 1, t, 0, e - b, base + b, out, n);
    }
    return n;
}

/* the boxes of the global tensor covering elements [begin, begin + count) of t's box */
static int range_boxes(const loom_tensor_info *t, size_t begin, size_t count, box *out) {
    box tmpl;
    memset(&tmpl, 0, sizeof tmpl);
    return cut(t->ndim, t->box_off, t->box_len, 0, tmpl, (int64_t)begin,
               (int64_t)(begin + count), 0, out, 0);
}

/* the intersection of two boxes; 0 when empty */
static int intersect(int ndim, const box *a, const box *b, int64_t *lo, int64_t *hi) {
    for (int d = 0; d < ndim; d++) {
        lo[d] = a->off[d] > b->off[d] ? a->off[d] : b->off[d];
        const int64_t ea = a->off[d] + a->len[d], eb = b->off[d] + b->len[d];
        hi[d] = ea < eb ? ea : eb;
        if (lo[d] >= hi[d]) return 0;
    }
    return 1;
}

/* copies the region [lo, hi) from box s (data sd, row-major) into box t (data td) */
static void copy_region(int ndim, const int64_t *lo, const int64_t *hi, const box *s,
                        const float *sd, const box *t, float *td) {
    int64_t idx[MAXD];
    for (int d = 0; d < ndim; d++) idx[d] = lo[d];
    const int last = ndim - 1;
    const size_t run = (size_t)(hi[last] - lo[last]);
    for (;;) {
        int64_t so = 0, to = 0;
        for (int d = 0; d < ndim; d++) {
            so = so * s->len[d] + (idx[d] - s->off[d]);
            to = to * t->len[d] + (idx[d] - t->off[d]);
        }
        memcpy(td + to, sd + so, run * sizeof(float));
        int d = last - 1;
        for (; d >= 0; d--) {
            if (++idx[d] < hi[d]) break;
            idx[d] = lo[d];
        }
        if (d < 0) break;
    }
}

static void format_dims(char *buf, size_t size, int ndim, const int64_t *v, const char *open,
                        const char *sep, const char *close) {
    size_t at = (size_t)snprintf(buf, size, "%s", open);
    for (int d = 0; d < ndim && at < size; d++)
        at += (size_t)snprintf(buf + at, size - at, "%s%" PRId64, d ? sep : "", v[d]);
    if (at < size) snprintf(buf + at, size - at, "%s", close);
}

/* ---- writing ---------------------------------------------------------------------------- */

int loom_pieces_serialize(const loom_dp_piece *p, int n, char **buf, size_t *len, loom_err *err) {
    /* every piece becomes up to 2 * MAXD - 1 boxes */
    const size_t cap = (size_t)n * (2 * MAXD) + 1;
    loom_st_tensor *t = loom_calloc(cap, sizeof *t);
    char **names = loom_calloc(cap, sizeof *names);
    /* metadata: format + one global shape per distinct tensor */
    const char **meta = loom_calloc(2 * (size_t)n + 4, sizeof *meta);
    char **meta_own = loom_calloc(2 * (size_t)n + 4, sizeof *meta_own);
    int nm = 0, nown = 0, nt = 0;
    meta[nm++] = "format";
    meta[nm++] = FORMAT_V2;
    for (int i = 0; i < n; i++) {
        const loom_tensor_info *ti = p[i].tensor;
        box bx[2 * MAXD];
        const int nb = range_boxes(ti, p[i].begin, p[i].count, bx);
        for (int k = 0; k < nb; k++) {
            char offs[96], tmp[200];
            format_dims(offs, sizeof offs, ti->ndim, bx[k].off, "", ",", "");
            snprintf(tmp, sizeof tmp, "%s/%s/%s", KIND_NAMES[p[i].kind], ti->name, offs);
            names[nt] = loom_strdup(tmp);
            t[nt].name = names[nt];
            t[nt].data = p[i].data + (bx[k].start - (int64_t)p[i].begin);
            t[nt].ndim = ti->ndim;
            for (int d = 0; d < ti->ndim; d++) t[nt].shape[d] = bx[k].len[d];
            nt++;
        }
        int seen = 0;
        for (int j = 0; j < i && !seen; j++) seen = !strcmp(p[j].tensor->name, ti->name);
        if (seen) continue;
        char key[96], val[96];
        snprintf(key, sizeof key, "shape/%s", ti->name);
        format_dims(val, sizeof val, ti->ndim, ti->shape, "[", ", ", "]");
        meta[nm++] = meta_own[nown++] = loom_strdup(key);
        meta[nm++] = meta_own[nown++] = loom_strdup(val);
    }
    meta[nm] = NULL;
    int rc = loom_safetensors_serialize(t, nt, meta, buf, len, err);
    for (int i = 0; i < nt; i++) free(names[i]);
    for (int i = 0; i < nown; i++) free(meta_own[i]);
    free(names);
    free(meta_own);
    free(meta);
    free(t);
    return rc;
}

/* ---- reading ---------------------------------------------------------------------------- */

/* one source box found in a file */
typedef struct src_piece {
    int kind;
    char tensor[64];
    int ndim;
    box b;              /* in the global tensor (b.start unused) */
    const float *data;  /* the box's element 0 in memory, or NULL: */
    uint64_t foff;      /* its byte offset in a deferred file (read through a reader) */
    const char *file;
    int fidx;
} src_piece;

static int cmp_src(const void *a, const void *b) {
    const src_piece *x = a, *y = b;
    if (x->kind != y->kind) return x->kind - y->kind;
    return strcmp(x->tensor, y->tensor);
}

/* by tensor, then by the box's first dimension's offset */
static int cmp_src_pos(const void *a, const void *b) {
    const int c = cmp_src(a, b);
    if (c) return c;
    const src_piece *x = a, *y = b;
    return x->b.off[0] < y->b.off[0] ? -1 : x->b.off[0] > y->b.off[0];
}

static int parse_u64(const char **s, uint64_t *out) {
    const char *d = *s;
    uint64_t v = 0;
    if (*d < '0' || *d > '9') return -1;
    for (; *d >= '0' && *d <= '9'; d++) {
        if (v > (UINT64_MAX - 9) / 10) return -1;
        v = v * 10 + (uint64_t)(*d - '0');
    }
    *s = d;
    *out = v;
    return 0;
}

/* "<kind>/<tensor>/<a>[,<b>...]": the offsets (v2) or the flat begin (v1, one number) */
static int parse_piece_name(const char *name, int *kind, char *tensor, size_t tsize,
                            int64_t *offs, int *noffs) {
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
    *noffs = 0;
    for (;;) {
        uint64_t v;
        if (*noffs == MAXD || parse_u64(&d, &v) || v > (uint64_t)INT64_MAX) return -1;
        offs[(*noffs)++] = (int64_t)v;
        if (!*d) return 0;
        if (*d != ',') return -1;
        d++;
    }
}

/* "[a, b, ...]" -> dims; -1 when malformed */
static int parse_shape(const char *s, int64_t *dims) {
    if (!s || *s != '[') return -1;
    s++;
    int n = 0;
    for (;;) {
        uint64_t v;
        if (n == MAXD || parse_u64(&s, &v) || v > (uint64_t)INT64_MAX) return -1;
        dims[n++] = (int64_t)v;
        if (*s == ']') return s[1] ? -1 : n;
        if (s[0] != ',' || s[1] != ' ') return -1;
        s += 2;
    }
}

static void push_src(src_piece **src, size_t *nsrc, size_t *cap, const src_piece *sp) {
    if (*nsrc == *cap) {
        *cap = *cap ? 2 * *cap : 256;
        *src = loom_realloc(*src, *cap * sizeof **src);
    }
    (*src)[(*nsrc)++] = *sp;
}

/* Reads the pieces of one file into src (boxes); v1 flat ranges are cut into boxes. */
static int read_file(loom_st_file *f, int deferred, const char *fname, int fidx,
                     const char *where, src_piece **src, size_t *nsrc, size_t *cap, loom_err *err) {
    const char *fmt = loom_safetensors_metadata(f, "format");
    const int v1 = fmt && !strcmp(fmt, FORMAT_V1), v2 = fmt && !strcmp(fmt, FORMAT_V2);
    if (!v1 && !v2)
        return loom_errf(err, "%s: not a loom piece file (metadata format = %s; this loom reads "
                              "%s and %s)", where, fmt ? fmt : "absent", FORMAT_V1, FORMAT_V2);
    for (int i = 0; i < loom_safetensors_count(f); i++) {
        src_piece sp = {.file = fname, .fidx = fidx};
        const char *name = loom_safetensors_name(f, i);
        int64_t offs[MAXD];
        int noffs;
        if (parse_piece_name(name, &sp.kind, sp.tensor, sizeof sp.tensor, offs, &noffs) ||
            (v1 && noffs != 1))
            return loom_errf(err, "%s: tensor '%.100s' is not named <kind>/<tensor>/%s", where,
                             name, v1 ? "<begin>" : "<offset>,<offset>...");
        char key[96];
        snprintf(key, sizeof key, "shape/%s", sp.tensor);
        int64_t gshape[MAXD];
        const int gnd = parse_shape(loom_safetensors_metadata(f, key), gshape);
        if (gnd < 1)
            return loom_errf(err, "%s: piece '%.100s' has no valid shape/%s metadata", where,
                             name, sp.tensor);
        for (int d = 0, big = 0; d < gnd; d++) { /* the element count must fit comfortably */
            big += gshape[d] > ((int64_t)1 << 40);
            if (big || (d > 0 && volume(d + 1, gshape) / gshape[d] != volume(d, gshape)) ||
                volume(d + 1, gshape) > ((int64_t)1 << 50))
                return loom_errf(err, "%s: shape/%s is too large", where, sp.tensor);
        }
        int nd;
        int64_t shape[8];
        if (deferred ? loom_safetensors_locate(f, name, &sp.foff, &nd, shape, err)
                     : loom_safetensors_get(f, name, &sp.data, &nd, shape, err))
            return -1;
        sp.ndim = gnd;
        if (v1) { /* a flat range of the whole tensor */
            if (nd != 1) return loom_errf(err, "%s: piece '%.100s' is not 1-D", where, name);
            const uint64_t total = (uint64_t)volume(gnd, gshape), b = (uint64_t)offs[0];
            if (b > total || (uint64_t)shape[0] > total - b)
                return loom_errf(err, "%s: piece '%.100s' of %" PRId64 " elements runs past the "
                                      "tensor's %" PRIu64, where, name, shape[0], total);
            const int64_t zero[MAXD] = {0};
            box tmpl, bx[2 * MAXD];
            memset(&tmpl, 0, sizeof tmpl);
            const int nb = cut(gnd, zero, gshape, 0, tmpl, (int64_t)b, (int64_t)b + shape[0],
                               0, bx, 0);
            const float *base = sp.data;
            const uint64_t base_off = sp.foff;
            for (int k = 0; k < nb; k++) {
                sp.b = bx[k];
                if (base) sp.data = base + (bx[k].start - (int64_t)b);
                sp.foff = base_off + (uint64_t)(bx[k].start - (int64_t)b) * sizeof(float);
                push_src(src, nsrc, cap, &sp);
            }
            continue;
        }
        if (nd != gnd || noffs != gnd)
            return loom_errf(err, "%s: piece '%.100s' has %d dimensions and %d offsets, its "
                                  "tensor %d", where, name, nd, noffs, gnd);
        for (int d = 0; d < gnd; d++) {
            if (offs[d] > gshape[d] || shape[d] > gshape[d] - offs[d])
                return loom_errf(err, "%s: piece '%.100s' runs past the tensor's dimension %d "
                                      "(%" PRId64 ")", where, name, d, gshape[d]);
            sp.b.off[d] = offs[d];
            sp.b.len[d] = shape[d];
        }
        push_src(src, nsrc, cap, &sp);
    }
    return 0;
}

/* the recorded global shape of `tensor` in a file matches (ndim, shape) */
static int shape_matches(const loom_st_file *f, const char *tensor, int ndim, const int64_t *shape) {
    char key[96];
    snprintf(key, sizeof key, "shape/%s", tensor);
    int64_t got[MAXD];
    const int n = parse_shape(loom_safetensors_metadata(f, key), got);
    if (n != ndim) return 0;
    for (int d = 0; d < n; d++)
        if (got[d] != shape[d]) return 0;
    return 1;
}


/* ---- deferred files: reading the needed byte ranges in one pass ------------------------- */

/* bytes [off, off + len) of deferred file fidx go to dst */
typedef struct run {
    int fidx;
    uint64_t off;
    size_t len;
    char *dst;
} run;

typedef struct runs {
    run *r;
    size_t n, cap;
} runs;

static void push_run(runs *rs, int fidx, uint64_t off, size_t len, char *dst) {
    if (rs->n) { /* contiguous in the file and in memory: one run */
        run *last = &rs->r[rs->n - 1];
        if (last->fidx == fidx && last->off + last->len == off && last->dst + last->len == dst) {
            last->len += len;
            return;
        }
    }
    if (rs->n == rs->cap) {
        rs->cap = rs->cap ? 2 * rs->cap : 256;
        rs->r = loom_realloc(rs->r, rs->cap * sizeof *rs->r);
    }
    rs->r[rs->n++] = (run){fidx, off, len, dst};
}

static int cmp_run(const void *a, const void *b) {
    const run *x = a, *y = b;
    if (x->fidx != y->fidx) return x->fidx - y->fidx;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* copy_region for a source box in a deferred file: the row runs of [lo, hi), in order */
static void region_runs(int ndim, const int64_t *lo, const int64_t *hi, const src_piece *s,
                        const box *t, float *td, runs *rs) {
    int64_t idx[MAXD];
    for (int d = 0; d < ndim; d++) idx[d] = lo[d];
    const int last = ndim - 1;
    const size_t run_len = (size_t)(hi[last] - lo[last]) * sizeof(float);
    for (;;) {
        int64_t so = 0, to = 0;
        for (int d = 0; d < ndim; d++) {
            so = so * s->b.len[d] + (idx[d] - s->b.off[d]);
            to = to * t->len[d] + (idx[d] - t->off[d]);
        }
        push_run(rs, s->fidx, s->foff + (uint64_t)so * sizeof(float), run_len,
                 (char *)(td + to));
        int d = last - 1;
        for (; d >= 0; d--) {
            if (++idx[d] < hi[d]) break;
            idx[d] = lo[d];
        }
        if (d < 0) break;
    }
}

/* Opens a reader on a deferred piece file and parses its header (the file's first bytes,
 * hashed as the start of the one pass). */
static int open_deferred(const loom_ckpt *ck, const char *fname, const char *where,
                         loom_ckpt_reader **rd, loom_st_file **st, loom_err *err) {
    if (loom_ckpt_reader_open(ck, fname, rd, err)) return -1;
    const uint64_t size = loom_ckpt_reader_size(*rd);
    if (size < 8)
        return loom_errf(err, "%s: file is %" PRIu64 " bytes, too short for the 8-byte header "
                              "length", where, size);
    char len8[8];
    if (loom_ckpt_reader_read(*rd, 0, len8, 8, err)) return -1;
    uint64_t hl;
    memcpy(&hl, len8, 8);
    if (hl > size - 8 || hl > ((uint64_t)100 << 20)) /* parse_header names the problem */
        return loom_safetensors_parse_header(len8, 8, size, where, st, err);
    char *head = loom_malloc((size_t)hl + 8);
    memcpy(head, len8, 8);
    int rc = loom_ckpt_reader_read(*rd, 8, head + 8, (size_t)hl, err);
    if (rc == 0) rc = loom_safetensors_parse_header(head, (size_t)hl + 8, size, where, st, err);
    free(head);
    return rc;
}

int loom_pieces_fill(const loom_ckpt *ck, loom_dp_piece *needed, int n, loom_err *err) {
    const int nf = loom_ckpt_num_files(ck);
    loom_st_file **files = loom_calloc((size_t)nf + 1, sizeof *files);
    loom_ckpt_reader **readers = loom_calloc((size_t)nf + 1, sizeof *readers);
    runs rs = {0};
    src_piece *src = NULL;
    size_t nsrc = 0, cap = 0;
    int rc = -1, any = 0;
    char where[4400];
    for (int f = 0; f < nf; f++) {
        const char *fname = loom_ckpt_file_name(ck, f);
        if (!loom_pieces_is_file(fname)) continue;
        any = 1;
        size_t len;
        const int deferred = loom_ckpt_file_deferred(ck, fname);
        loom_pathf(where, sizeof where, "%s/%s", loom_ckpt_dir(ck), fname);
        if (deferred) {
            if (open_deferred(ck, fname, where, &readers[f], &files[f], err)) goto done;
        } else {
            const char *buf = loom_ckpt_file_data(ck, fname, &len);
            if (loom_safetensors_parse(buf, len, where, &files[f], err)) goto done;
        }
        if (read_file(files[f], deferred, fname, f, where, &src, &nsrc, &cap, err)) goto done;
    }
    if (!any) {
        loom_errf(err, "%s: checkpoint has no rank_*.safetensors piece files", loom_ckpt_dir(ck));
        goto done;
    }
    qsort(src, nsrc, sizeof *src, cmp_src_pos);
    for (size_t g = 0; g < nsrc;) { /* no two boxes of one tensor may overlap */
        size_t e = g + 1;
        while (e < nsrc && !cmp_src(&src[g], &src[e])) e++;
        for (size_t i = g; i < e; i++) /* sorted by dim-0 offset: only the ones starting inside */
            for (size_t j = i + 1; j < e && src[j].b.off[0] < src[i].b.off[0] + src[i].b.len[0]; j++) {
                int64_t lo[MAXD], hi[MAXD];
                if (src[i].ndim != src[j].ndim || intersect(src[i].ndim, &src[i].b, &src[j].b, lo, hi)) {
                    loom_errf(err, "%s: pieces of %s '%s' overlap (in %s and %s)", loom_ckpt_dir(ck),
                              KIND_NAMES[src[i].kind], src[i].tensor, src[i].file, src[j].file);
                    goto done;
                }
            }
        g = e;
    }
    for (int k = 0; k < n; k++) {
        loom_dp_piece *p = &needed[k];
        const loom_tensor_info *t = p->tensor;
        /* the tensor under its own name, else (a checkpoint of the fused format) its rows of
         * the fused tensor: q_w/k_w/v_w in qkv_w, gate_w/up_w in llama's fc_w */
        src_piece key = {.kind = p->kind};
        snprintf(key.tensor, sizeof key.tensor, "%s", t->name);
        const src_piece *own = nsrc ? bsearch(&key, src, nsrc, sizeof *src, cmp_src) : NULL;
        const int legacy = !own && t->legacy_name[0];
        const char *want = legacy ? t->legacy_name : t->name;
        const int want_ndim = legacy ? t->legacy_ndim : t->ndim;
        const int64_t *want_shape = legacy ? t->legacy_shape : t->shape;
        const int64_t row0 = legacy ? t->legacy_row0 : 0; /* want's row of t's row 0 */
        box dst[2 * MAXD];
        const int nd = range_boxes(t, p->begin, p->count, dst);
        uint64_t covered = 0;
        for (size_t i = 0; i < nsrc; i++) {
            const src_piece *s = &src[i];
            if (s->kind != p->kind || strcmp(s->tensor, want) != 0) continue;
            if (!shape_matches(files[s->fidx], want, want_ndim, want_shape)) {
                char got[96], exp[96], mkey[96];
                snprintf(mkey, sizeof mkey, "shape/%s", want);
                const char *g = loom_safetensors_metadata(files[s->fidx], mkey);
                snprintf(got, sizeof got, "%s", g ? g : "(none)");
                format_dims(exp, sizeof exp, want_ndim, want_shape, "[", ", ", "]");
                loom_errf(err, "%s/%s: tensor '%s' has shape %s in the checkpoint, the model "
                               "wants %s (is this the same model config?)",
                          loom_ckpt_dir(ck), s->file, want, got, exp);
                goto done;
            }
            box sb = s->b; /* in t's global coordinates */
            sb.off[0] -= row0;
            for (int b = 0; b < nd; b++) {
                int64_t lo[MAXD], hi[MAXD];
                if (!intersect(t->ndim, &sb, &dst[b], lo, hi)) continue;
                float *td = p->data + (dst[b].start - (int64_t)p->begin);
                if (s->data) copy_region(t->ndim, lo, hi, &sb, s->data, &dst[b], td);
                else {
                    src_piece ss = *s;
                    ss.b = sb;
                    region_runs(t->ndim, lo, hi, &ss, &dst[b], td, &rs);
                }
                int64_t v = 1;
                for (int d = 0; d < t->ndim; d++) v *= hi[d] - lo[d];
                covered += (uint64_t)v;
            }
        }
        if (covered != p->count) {
            loom_errf(err, "%s: the checkpoint holds %" PRIu64 " of the %zu elements of %s '%s' "
                           "this rank needs", loom_ckpt_dir(ck), covered, p->count,
                      KIND_NAMES[p->kind], t->name);
            goto done;
        }
    }
    /* the deferred files, each front to back once: the needed ranges straight into place,
     * everything else hashed and dropped, then the SHA-256 checked */
    if (rs.n) qsort(rs.r, rs.n, sizeof *rs.r, cmp_run);
    for (int f = 0, i = 0; f < nf; f++) {
        if (!readers[f]) continue;
        for (; i < (int)rs.n && rs.r[i].fidx == f; i++)
            if (loom_ckpt_reader_read(readers[f], rs.r[i].off, rs.r[i].dst, rs.r[i].len, err))
                goto done;
        if (loom_ckpt_reader_finish(readers[f], err)) goto done;
    }
    rc = 0;
done:
    for (int f = 0; f < nf; f++) {
        loom_safetensors_close(files[f]);
        loom_ckpt_reader_close(readers[f]);
    }
    free(readers);
    free(rs.r);
    free(files);
    free(src);
    return rc;
}

int loom_pieces_load_params(const loom_ckpt *ck, loom_model *m, loom_err *err) {
    const int nt = loom_model_num_tensors(m);
    loom_dp_piece *need = loom_calloc((size_t)nt, sizeof *need);
    /* the bytes go straight into the arena where the backend's memory is host memory (cpu);
     * elsewhere into a host buffer, then one copy to the device */
    const loom_backend *be = loom_model_backend(m);
    const size_t np = loom_model_num_params(m);
    float *host = be->host_memory ? NULL : loom_malloc((np ? np : 1) * sizeof(float));
    float *base = host ? host : loom_model_params(m);
    for (int i = 0; i < nt; i++) {
        const loom_tensor_info *t = loom_model_tensor(m, i);
        need[i] = (loom_dp_piece){0, t, 0, t->numel, base + t->offset};
    }
    int rc = loom_pieces_fill(ck, need, nt, err);
    if (rc == 0 && host) be->mem_h2d(loom_model_params(m), host, np * sizeof(float));
    free(host);
    free(need);
    return rc;
}
