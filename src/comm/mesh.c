/* The process mesh: layout validation, the parallel.* config keys, the groups' communicators
 * (MPI_Comm_split, TP innermost) and the progress window that names missing ranks. */
#include "comm_internal.h"

#include <stdlib.h>
#include <string.h>

const loom_config_key loom_comm_config_keys[] = {
    {"parallel.dp", "auto", "data-parallel degree, or auto = world size / (tp * pp * cp)"},
    {"parallel.tp", "1", "tensor-parallel degree (innermost: consecutive ranks)"},
    {"parallel.pp", "1", "pipeline-parallel degree (stages)"},
    {"parallel.cp", "1", "context-parallel degree (sequence split)"},
    {"parallel.ep", "1", "expert-parallel degree, carved from dp * cp"},
    {"parallel.timeout_s", "600", "a collective not done after this many seconds ends the job"},
};
const int loom_comm_config_nkeys = (int)(sizeof loom_comm_config_keys / sizeof loom_comm_config_keys[0]);

#define MAX_DEGREE 1048576

void loom_mesh_spec_default(loom_mesh_spec *s) {
    memset(s, 0, sizeof *s);
    s->dp = s->tp = s->pp = s->cp = s->ep = 1;
    s->dp_auto = 1;
    s->timeout_s = 600;
}

static const char *origin_of(const loom_config *c, const char *key) {
    const char *o = loom_config_origin(c, key);
    return o ? o : "?";
}

static int get_degree(const loom_config *c, const char *key, int *out, loom_err *err) {
    if (!loom_config_get(c, key)) return 0;
    int64_t v;
    if (loom_config_get_int(c, key, &v, err)) return -1;
    if (v < 1 || v > MAX_DEGREE)
        return loom_errf(err, "%s=%lld (set at %s): must be between 1 and %d", key, (long long)v,
                         origin_of(c, key), MAX_DEGREE);
    *out = (int)v;
    return 0;
}

int loom_mesh_spec_from_config(const loom_config *c, loom_mesh_spec *s, loom_err *err) {
    loom_mesh_spec_default(s);
    const char *dp = loom_config_get(c, "parallel.dp");
    if (dp && strcmp(dp, "auto") != 0) {
        if (get_degree(c, "parallel.dp", &s->dp, err)) {
            return loom_errf(err, "parallel.dp=%s (set at %s): must be a positive integer or "
                                  "'auto'", dp, origin_of(c, "parallel.dp"));
        }
        s->dp_auto = 0;
    }
    if (get_degree(c, "parallel.tp", &s->tp, err) || get_degree(c, "parallel.pp", &s->pp, err) ||
        get_degree(c, "parallel.cp", &s->cp, err) || get_degree(c, "parallel.ep", &s->ep, err))
        return -1;
    if (loom_config_get(c, "parallel.timeout_s")) {
        if (loom_config_get_double(c, "parallel.timeout_s", &s->timeout_s, err)) return -1;
        if (!(s->timeout_s > 0) || s->timeout_s > 1e7)
            return loom_errf(err, "parallel.timeout_s=%s (set at %s): must be a number of seconds "
                                  "> 0", loom_config_get(c, "parallel.timeout_s"),
                             origin_of(c, "parallel.timeout_s"));
    }
    return 0;
}

int loom_mesh_validate(const loom_mesh_spec *s, int world, const loom_mesh_dims *d,
                       loom_mesh_spec *out, loom_err *err) {
    loom_mesh_spec r = *s;
    const struct { const char *k; int v; } deg[] = {
        {"tp", s->tp}, {"pp", s->pp}, {"cp", s->cp}, {"ep", s->ep}, {"dp", s->dp_auto ? 1 : s->dp}};
    for (int i = 0; i < 5; i++)
        if (deg[i].v < 1 || deg[i].v > MAX_DEGREE)
            return loom_errf(err, "parallel.%s=%d: must be between 1 and %d", deg[i].k, deg[i].v,
                             MAX_DEGREE);
    if (!(s->timeout_s > 0))
        return loom_errf(err, "parallel.timeout_s=%g: must be > 0", s->timeout_s);
    if (world < 1) return loom_errf(err, "world size %d: must be >= 1", world);
    int64_t inner = (int64_t)s->tp * s->pp * s->cp;
    if (s->dp_auto) {
        if (world % inner != 0)
            return loom_errf(err, "parallel.dp=auto: parallel.tp * parallel.pp * parallel.cp = "
                                  "%d * %d * %d = %lld does not divide the world size %d",
                             s->tp, s->pp, s->cp, (long long)inner, world);
        r.dp = (int)(world / inner);
        r.dp_auto = 0;
    }
    int64_t prod = inner * r.dp;
    if (prod != world)
        return loom_errf(err, "parallel.dp * parallel.tp * parallel.pp * parallel.cp = "
                              "%d * %d * %d * %d = %lld but the world has %d rank%s (launch "
                              "exactly that many with mpirun -np / srun -n, or set "
                              "parallel.dp=auto)",
                         r.dp, s->tp, s->pp, s->cp, (long long)prod, world, world == 1 ? "" : "s");
    int64_t dc = (int64_t)r.dp * r.cp;
    if (dc % r.ep != 0)
        return loom_errf(err, "parallel.ep=%d must divide parallel.dp * parallel.cp = %d * %d = "
                              "%lld (experts are sharded over data/context-parallel ranks)",
                         r.ep, r.dp, r.cp, (long long)dc);
    if (d) {
        if (d->n_head > 0 && d->n_head % r.tp != 0)
            return loom_errf(err, "parallel.tp=%d does not divide model.n_head=%d (each "
                                  "tensor-parallel rank needs a whole number of heads)",
                             r.tp, d->n_head);
        if (d->n_kv_head > 0 &&
            (d->n_kv_head >= r.tp ? d->n_kv_head % r.tp : r.tp % d->n_kv_head) != 0)
            return loom_errf(err, "parallel.tp=%d neither divides model.n_kv_head=%d nor is a "
                                  "multiple of it (each tensor-parallel rank needs a whole number "
                                  "of key/value heads, or one shared by tp / n_kv_head ranks)",
                             r.tp, d->n_kv_head);
        if (d->n_layer > 0 && d->n_layer % r.pp != 0)
            return loom_errf(err, "parallel.pp=%d does not divide model.n_layer=%d (every "
                                  "pipeline stage holds the same number of layers)",
                             r.pp, d->n_layer);
        if (d->seq_len > 0 && d->seq_len % r.cp != 0)
            return loom_errf(err, "parallel.cp=%d does not divide the sequence length %d "
                                  "(training.seq_len; each context-parallel rank holds an equal "
                                  "chunk)", r.cp, d->seq_len);
        if (r.ep > 1 && d->n_expert <= 0)
            return loom_errf(err, "parallel.ep=%d but the model has no experts (model.moe.experts)",
                             r.ep);
        if (d->n_expert > 0 && d->n_expert % r.ep != 0)
            return loom_errf(err, "parallel.ep=%d does not divide model.moe.experts=%d (each "
                                  "expert-parallel rank holds the same number of experts)",
                             r.ep, d->n_expert);
    }
    if (out) *out = r;
    return 0;
}

/* ---- coordinates -------------------------------------------------------------------- */

typedef struct coords {
    int dp, pp, cp, tp, ep, edp, dc;
} coords;

static coords coords_of(const loom_mesh_spec *s, int r) {
    coords c;
    c.tp = r % s->tp;
    c.cp = (r / s->tp) % s->cp;
    c.pp = (r / (s->tp * s->cp)) % s->pp;
    c.dp = r / (s->tp * s->cp * s->pp);
    c.dc = c.dp * s->cp + c.cp;
    c.ep = c.dc % s->ep;
    c.edp = c.dc / s->ep;
    return c;
}

/* color: which group of kind g rank r belongs to; key: its member number there. */
loom_mesh_coords loom_mesh_coords_of(const loom_mesh_spec *s, int rank) {
    const coords c = coords_of(s, rank);
    return (loom_mesh_coords){c.dp, c.pp, c.cp, c.tp, c.ep, c.edp, c.dc};
}

static void color_key(const loom_mesh_spec *s, loom_group g, int r, int64_t *color, int *key) {
    coords c = coords_of(s, r);
    switch (g) {
    case LOOM_GROUP_WORLD: *color = 0; *key = r; return;
    case LOOM_GROUP_DP: *color = ((int64_t)c.pp * s->cp + c.cp) * s->tp + c.tp; *key = c.dp; return;
    case LOOM_GROUP_TP: *color = r / s->tp; *key = c.tp; return;
    case LOOM_GROUP_PP: *color = ((int64_t)c.dp * s->cp + c.cp) * s->tp + c.tp; *key = c.pp; return;
    case LOOM_GROUP_CP: *color = ((int64_t)c.dp * s->pp + c.pp) * s->tp + c.tp; *key = c.cp; return;
    case LOOM_GROUP_EP: *color = ((int64_t)c.edp * s->pp + c.pp) * s->tp + c.tp; *key = c.ep; return;
    case LOOM_GROUP_DPCP: *color = (int64_t)c.pp * s->tp + c.tp; *key = c.dc; return;
    case LOOM_GROUP_EDP: *color = ((int64_t)c.ep * s->pp + c.pp) * s->tp + c.tp; *key = c.edp; return;
    default: LOOM_CHECK(0);
    }
}

static const char *group_names[LOOM_GROUP_COUNT] = {"world", "dp", "tp", "pp", "cp", "ep", "dpcp", "edp"};

const char *loom_group_name(loom_group g) {
    return g >= 0 && g < LOOM_GROUP_COUNT ? group_names[g] : "?";
}

int loom_mesh_create(const loom_mesh_spec *s, const loom_mesh_dims *dims, loom_mesh **out,
                     loom_err *err) {
    *out = NULL;
    int world = loom_comm_world_size(), me = loom_comm_world_rank();
    loom_mesh_spec r;
    if (loom_mesh_validate(s, world, dims, &r, err)) return -1;
    loom_mesh *m = loom_calloc(1, sizeof *m);
    m->spec = r;
    m->world_rank = me;
    m->world_size = world;
    m->mpi = comm_mpi_up();
    for (int g = 0; g < LOOM_GROUP_COUNT; g++) {
        comm_group *cg = &m->g[g];
        int64_t mycolor;
        int mykey;
        color_key(&r, (loom_group)g, me, &mycolor, &mykey);
        int n = 0;
        for (int i = 0; i < world; i++) {
            int64_t col;
            int key;
            color_key(&r, (loom_group)g, i, &col, &key);
            n += col == mycolor;
        }
        cg->size = n;
        cg->rank = mykey;
        cg->members = loom_calloc((size_t)n, sizeof(int));
        for (int i = 0; i < n; i++) cg->members[i] = -1;
        for (int i = 0; i < world; i++) {
            int64_t col;
            int key;
            color_key(&r, (loom_group)g, i, &col, &key);
            if (col != mycolor) continue;
            LOOM_CHECK(key >= 0 && key < n && cg->members[key] == -1);
            cg->members[key] = i;
        }
        cg->comm = MPI_COMM_NULL;
        if (m->mpi) {
            /* colors fit in int: they are < world size */
            MPI_Comm_split(MPI_COMM_WORLD, (int)mycolor, mykey, &cg->comm);
            int rr, ss;
            MPI_Comm_rank(cg->comm, &rr);
            MPI_Comm_size(cg->comm, &ss);
            LOOM_CHECK(rr == cg->rank && ss == cg->size);
        }
    }
    if (m->mpi) {
        /* Progress window: this rank's slots are window memory the others read with MPI_Rget
         * under one lock_all epoch kept for the mesh's lifetime (no target progress needed on
         * shared memory and RDMA networks). Local stores need the unified memory model. */
        int64_t *base = NULL;
        MPI_Win_allocate((MPI_Aint)(PROG_SLOTS * sizeof(int64_t)), (int)sizeof(int64_t),
                         MPI_INFO_NULL, MPI_COMM_WORLD, &base, &m->win);
        memset(base, 0, PROG_SLOTS * sizeof(int64_t));
        int *model = NULL, flag = 0;
        MPI_Win_get_attr(m->win, MPI_WIN_MODEL, &model, &flag);
        m->win_ok = flag && model && *model == MPI_WIN_UNIFIED;
        m->progress = base;
        MPI_Win_lock_all(MPI_MODE_NOCHECK, m->win);
        MPI_Barrier(MPI_COMM_WORLD); /* everyone's slots are zeroed before anyone reads */
    } else {
        m->progress = loom_calloc(PROG_SLOTS, sizeof(int64_t));
    }
    *out = m;
    return 0;
}

void loom_mesh_free(loom_mesh *m) {
    if (!m) return;
    comm_free_request_pool(m);
    comm_free_device(m);
    if (m->mpi) {
        MPI_Win_unlock_all(m->win);
        MPI_Win_free(&m->win);
    } else {
        free(m->progress);
    }
    for (int g = 0; g < LOOM_GROUP_COUNT; g++) {
        if (m->g[g].comm != MPI_COMM_NULL) MPI_Comm_free(&m->g[g].comm);
        free(m->g[g].members);
    }
    free(m);
}

static const comm_group *grp(const loom_mesh *m, loom_group g) {
    LOOM_CHECK(m && g >= 0 && g < LOOM_GROUP_COUNT);
    return &m->g[g];
}

int loom_mesh_rank(const loom_mesh *m, loom_group g) { return grp(m, g)->rank; }
int loom_mesh_size(const loom_mesh *m, loom_group g) { return grp(m, g)->size; }
int loom_mesh_group_local(const loom_mesh *m, loom_group g) {
    return grp(m, g)->comm == MPI_COMM_NULL;
}

int loom_mesh_group_world_rank(const loom_mesh *m, loom_group g, int i) {
    const comm_group *cg = grp(m, g);
    LOOM_CHECK(i >= 0 && i < cg->size);
    return cg->members[i];
}

const loom_mesh_spec *loom_mesh_layout(const loom_mesh *m) { return &m->spec; }

char *loom_mesh_describe(const loom_mesh *m, char *buf, size_t size) {
    snprintf(buf, size, "dp=%d tp=%d pp=%d cp=%d ep=%d (world %d)", m->spec.dp, m->spec.tp,
             m->spec.pp, m->spec.cp, m->spec.ep, m->world_size);
    return buf;
}
