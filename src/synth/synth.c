/* loom synth: a synthetic-data pipeline (docs/synth.md).
 *
 * Rounds: every (seed, sample) item starts at attempt 1; each round generates the prompts of
 * all pending items (block by block: the local engine batches them; the HTTP generator sends them over
 * `concurrency` connections), then runs the validators in order on every output (threads);
 * an item whose output fails gets another attempt with the failing validator's message added
 * to its prompt, up to max_attempts. Sampling seeds derive from (pipeline seed, item, attempt),
 * and the output is written in item order, so it does not depend on the thread count. */

#define _GNU_SOURCE
#include "synth/synth_internal.h"
#include "loom/grammar.h"

#include <curl/curl.h>
#include <errno.h>
#include <signal.h>
#include <unistd.h>

#include "loom/progress.h"

static void run_pool(void *(*fn)(void *), void *arg, int threads) {
    pthread_t *t = loom_calloc((size_t)threads, sizeof *t);
    for (int i = 0; i < threads; i++) LOOM_CHECK(pthread_create(&t[i], NULL, fn, arg) == 0);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    free(t);
}

int loom_synth_run(const char *path, const loom_synth_opts *o, loom_err *err) {
    pipeline P;
    memset(&P, 0, sizeof P);
    P.path = path;
    int rc = -1;
    local_gen L = {0};
    item *items = NULL;
    int n_items = 0;
    FILE *out = NULL, *rej = NULL;
    uint64_t *hashes = NULL;
    size_t n_hash = 0, cap_hash = 0;
    loom_mesh *mesh = NULL;
    const int rank = loom_comm_world_rank(), world = loom_comm_world_size();
    const int quiet = (o && o->quiet) || rank > 0;
    int uniform = 1; /* an error every rank meets alike (the pipeline file) */
    if (loom_yaml_json_file(path, (size_t)16 << 20, &P.root, err) || synth_parse_pipeline(&P, err))
        goto done;
    const int threads = o && o->threads > 0 ? o->threads : 2;
    signal(SIGPIPE, SIG_IGN); /* a command validator that exits without reading its input */
    if (o && o->no_cache) P.C.on = 0;
    if (P.C.on && synth_cache_open(&P.C, rank == 0, err)) goto done;
    if (P.C.skipped && rank == 0)
        fprintf(stderr, "loom: warning: %s: %lld torn or malformed cache lines skipped\n", P.C.dir, P.C.skipped);
    if (P.g.http) curl_global_init(CURL_GLOBAL_DEFAULT);
    const int tp = o && o->tp > 1 ? o->tp : 1, replicas = world / tp, replica = rank / tp;
    if (world % tp) {
        loom_errf(err, "--tp %d does not divide the %d ranks of the job (mpirun -np must be a "
                       "multiple of --tp)", tp, world);
        goto done;
    }
    if (tp > 1 && P.g.http) {
        loom_errf(err, "%s: --tp splits the local generator's model, but generator.kind is "
                       "http", path);
        goto done;
    }
    L.tp = tp;
    L.tp_rank = rank % tp;
    if (tp > 1) L.tp_points = o->tp_points;
    if (world > 1) {
        loom_mesh_spec spec;
        loom_mesh_spec_default(&spec);
        spec.timeout_s = 86400; /* ranks wait for the slowest one's round */
        if (loom_mesh_create(&spec, NULL, &mesh, err)) goto done;
    }
    n_items = P.sd.n * P.samples;
    items = loom_calloc((size_t)n_items, sizeof *items);
    for (int i = 0; i < n_items; i++) {
        items[i].seed_idx = i / P.samples;
        items[i].sample = i % P.samples;
    }
    /* exact duplicates are checked against the seeds and the accepted pool */
    for (int s = 0; s < P.sd.n; s++) {
        if (n_hash == cap_hash) hashes = loom_realloc(hashes, (cap_hash = cap_hash ? 2 * cap_hash : 256) * sizeof *hashes);
        hashes[n_hash++] = fnv1a(P.sd.v[s], P.sd.len[s]);
    }
    for (int v = 0; v < P.nv; v++) { /* near duplicates: against the seeds and the pool */
        if (P.v[v].kind != V_NEARDUP) continue;
        uint64_t *sig = loom_malloc((size_t)P.v[v].mh->perms * sizeof *sig);
        for (int s = 0; s < P.sd.n; s++) {
            synth_mh_signature(P.v[v].mh, P.sd.v[s], P.sd.len[s], sig);
            synth_mh_add(P.v[v].mh, sig, -1 - s);
        }
        free(sig);
    }
    long long *rejected_by = loom_calloc((size_t)P.nv + 1, sizeof(long long));
    long long *accepted_at = loom_calloc((size_t)P.max_attempts + 1, sizeof(long long));
    long long tokens = 0, generated = 0;
    const double t0 = loom_now();
    loom_progress pg;
    loom_progress_init(&pg, 0);
    item **pend = loom_calloc((size_t)n_items, sizeof *pend);
    item **mine = loom_calloc((size_t)n_items, sizeof *mine);
    item **gen = loom_calloc((size_t)n_items, sizeof *gen);
    uniform = 0;
    for (int attempt = 1; attempt <= P.max_attempts; attempt++) {
        int np = 0;
        for (int i = 0; i < n_items; i++) {
            item *it = &items[i];
            if (it->done) continue;
            it->attempt = attempt;
            loom_sbuf fb = {0}, pr = {0};
            if (attempt > 1) {
                size_t pl = it->tlen > 200 ? 200 : it->tlen;
                for (const char *p = P.feedback; *p;) {
                    if (!strncmp(p, "{message}", 9)) sb_str(&fb, it->vmsg), p += 9;
                    else if (!strncmp(p, "{previous}", 10)) loom_sbuf_append(&fb, it->text ? it->text : "", it->text ? pl : 0), p += 10;
                    else loom_sbuf_append(&fb, p, 1), p++;
                }
            }
            synth_render(&pr, P.tpl, P.sd.v[it->seed_idx], P.sd.len[it->seed_idx], fb.p ? fb.p : "");
            if (attempt > 1 && !strstr(P.tpl, "{feedback}")) sb_str(&pr, fb.p); /* appended */
            free(fb.p);
            free(it->prompt);
            free(it->text);
            it->text = NULL;
            it->tlen = 0;
            it->tokens = 0;
            it->gen_ok = 0;
            it->gen_err[0] = 0;
            it->vmsg[0] = 0;
            json_decref(it->results);
            it->results = NULL;
            json_decref(it->vfresh);
            it->vfresh = NULL;
            it->gen_hit = it->val_hits = it->val_runs = it->cached = 0;
            it->gkey[0] = 0;
            it->prompt = pr.p ? pr.p : loom_strdup("");
            pend[np++] = it;
        }
        if (np == 0) break;
        /* this rank's blocks, one at a time: cache lookups, generation (a local block is one
         * engine batch), validation, and (rank 0) the block's new outputs and verdicts appended
         * to the cache and synced, so a kill loses at most the block in progress. With an HTTP
         * generator a step is enough blocks for generator.concurrency requests in flight. */
        const int bper = P.g.http && P.g.concurrency > P.g.batch
                             ? (P.g.concurrency + P.g.batch - 1) / P.g.batch : 1;
        for (int k0 = 0; k0 < np;) {
            int nm = 0, ng = 0, k1 = k0, nb = 0;
            while (k1 < np && nb < bper) { /* this rank's next bper blocks from k0 */
                const int bend = (k1 / P.g.batch + 1) * P.g.batch < np ? (k1 / P.g.batch + 1) * P.g.batch : np;
                if (synth_owner_of(&P, k1, replicas) == replica) {
                    for (int k = k1; k < bend; k++) {
                        item *it = pend[k];
                        if (L.tp_rank == 0) mine[nm++] = it; /* a replica's tp rank 0 validates */
                        if (P.C.on) {
                            loom_sbuf kb = {0};
                            char sd[32];
                            snprintf(sd, sizeof sd, "%llu", (unsigned long long)item_seed(P.seed, it));
                            sb_str(&kb, P.g.temperature > 0 ? sd : "greedy");
                            loom_sbuf_append(&kb, "\n", 1);
                            sb_str(&kb, it->prompt);
                            synth_sha_hex_parts(it->gkey, P.gen_id, kb.p, kb.len);
                            free(kb.p);
                            json_t *hit = json_object_get(P.C.gen, it->gkey);
                            if (hit && !synth_text_from_json(hit, &it->text, &it->tlen)) {
                                it->tokens = (int)json_integer_value(json_object_get(hit, "tokens"));
                                it->gen_ok = it->gen_hit = 1;
                                continue;
                            }
                        }
                        gen[ng++] = it;
                    }
                    nb++;
                }
                k1 = bend;
            }
            if (P.g.http && ng) {
                http_pool hp = {.g = &P.g, .items = gen, .n = ng, .seed = P.seed};
                pthread_mutex_init(&hp.mu, NULL);
                run_pool(synth_http_worker, &hp, P.g.concurrency < ng ? P.g.concurrency : ng);
                pthread_mutex_destroy(&hp.mu);
            } else if (ng) {
                if (synth_local_open(&P, &L, err)) goto done_counts;
                /* one engine batch per block (the block's items not in the cache) */
                for (int a = 0, b; a < ng; a = b) {
                    const int blk = (int)(synth_pend_pos(pend, np, gen[a]) / P.g.batch);
                    for (b = a + 1; b < ng && (int)(synth_pend_pos(pend, np, gen[b]) / P.g.batch) == blk; b++) {}
                    synth_local_generate(&P, &L, gen + a, b - a);
                }
            }
            if (nm) {
                vpool vp = {.P = &P, .items = mine, .n = nm};
                pthread_mutex_init(&vp.mu, NULL);
                run_pool(synth_vworker, &vp, threads < nm ? threads : nm);
                pthread_mutex_destroy(&vp.mu);
            }
            for (int v = 0; v < P.nv; v++)
                if (P.v[v].sc && P.v[v].sc->failed) {
                    loom_errf(err, "%s: validator '%s': %s", path, P.v[v].name, P.v[v].sc->err.msg);
                    goto done_counts;
                }
            if (P.C.on && rank == 0 && nm) { /* this block's outcomes, durable now */
                for (int i = 0; i < nm; i++) synth_cache_add(&P, mine[i]);
                if (synth_cache_sync(&P.C, err)) goto done_counts;
            }
            k0 = k1;
        }
        if (world > 1) synth_exchange_items(mesh, rank, world, tp, pend, np, &P);
        for (int k = 0; P.C.on && k < np; k++) { /* the other ranks' outputs into the cache */
            item *it = pend[k];
            P.C.gen_hits += it->gen_hit;
            P.C.gen_runs += !it->gen_hit;
            P.C.val_hits += it->val_hits;
            P.C.val_runs += it->val_runs;
            synth_cache_add(&P, it);
        }
        if (P.C.on && rank == 0 && synth_cache_sync(&P.C, err)) goto done_counts;
        for (int k = 0; k < np; k++) { /* in item order: duplicates, verdicts */
            item *it = pend[k];
            generated++;
            tokens += it->tokens;
            if (it->failed_validator < 0) {
                const uint64_t h = fnv1a(it->text, it->tlen);
                for (int v = 0; v < P.nv && it->failed_validator < 0; v++) {
                    if (P.v[v].kind == V_UNIQUE) {
                        int dup = 0;
                        for (size_t j = 0; j < n_hash && !dup; j++) dup = hashes[j] == h;
                        json_array_append_new(it->results, json_pack("{s:s,s:b,s:s}", "validator", P.v[v].name,
                                                                     "ok", !dup, "message", dup ? "an exact duplicate" : ""));
                        if (dup) {
                            it->failed_validator = v;
                            snprintf(it->vmsg, sizeof it->vmsg, "%s: an exact duplicate of a seed or an earlier sample", P.v[v].name);
                        }
                    } else if (P.v[v].kind == V_NEARDUP) {
                        mh_index *mh = P.v[v].mh;
                        uint64_t *sig = loom_malloc((size_t)mh->perms * sizeof *sig);
                        synth_mh_signature(mh, it->text, it->tlen, sig);
                        double best;
                        int og = 0;
                        const int found = synth_mh_query(mh, sig, &og, &best);
                        free(sig);
                        const int near = found > 0;
                        char what[96] = "", msg[200] = "";
                        if (found >= 0) {
                            if (og < 0) snprintf(what, sizeof what, "seed %d", -1 - og);
                            else snprintf(what, sizeof what, "the sample %d of seed %d", items[og].sample, items[og].seed_idx);
                        }
                        if (near)
                            snprintf(msg, sizeof msg, "a near duplicate of %s (estimated Jaccard similarity %.3f >= %g)",
                                     what, best, mh->threshold);
                        json_t *res = json_pack("{s:s,s:b,s:s}", "validator", P.v[v].name, "ok", !near, "message", msg);
                        if (found >= 0) {
                            json_object_set_new(res, "similarity", json_real(best));
                            json_object_set_new(res, "nearest", json_string(what));
                        }
                        json_array_append_new(it->results, res);
                        if (near) {
                            it->failed_validator = v;
                            snprintf(it->vmsg, sizeof it->vmsg, "%s: %s", P.v[v].name, msg);
                        }
                    }
                }
            }
            if (it->failed_validator < 0) {
                it->done = it->accepted = 1;
                accepted_at[attempt]++;
                if (n_hash == cap_hash) hashes = loom_realloc(hashes, (cap_hash = cap_hash ? 2 * cap_hash : 256) * sizeof *hashes);
                hashes[n_hash++] = fnv1a(it->text, it->tlen);
                for (int v = 0; v < P.nv; v++) {
                    if (P.v[v].kind != V_NEARDUP) continue;
                    uint64_t *sig = loom_malloc((size_t)P.v[v].mh->perms * sizeof *sig);
                    synth_mh_signature(P.v[v].mh, it->text, it->tlen, sig);
                    synth_mh_add(P.v[v].mh, sig, (int)(it - items));
                    free(sig);
                }
            } else {
                rejected_by[it->failed_validator]++;
                if (attempt == P.max_attempts) it->done = 1;
            }
        }
        if (!quiet) { /* forced: one line per round (plain), the latest (terminal) */
            /* items, like the summary's accepted and rejected: rejected = failed their last
             * attempt; the others failed so far get another (retrying) */
            long long acc = 0, n_rej = 0, decided = 0, retry = 0;
            for (int a = 1; a <= attempt; a++) acc += accepted_at[a];
            for (int i = 0; i < n_items; i++) {
                decided += items[i].done;
                n_rej += items[i].done && !items[i].accepted;
                retry += !items[i].done && items[i].failed_validator >= 0;
            }
            const double dt = loom_now() - t0;
            char eta[48];
            loom_progress_eta(eta, sizeof eta, dt, (double)decided, (double)n_items);
            loom_progress_show(&pg, 1, "synth: attempt %d/%d: %lld/%d accepted, %lld rejected, "
                               "%lld to retry, %lld generations, %.1f samples/s, %s", attempt,
                               P.max_attempts, acc, n_items, n_rej, retry, generated,
                               dt > 0 ? (double)generated / dt : 0.0, eta);
        }
    }
    loom_progress_end(&pg);
    if (rank > 0) { /* rank 0 writes */
        rc = 0;
        goto done_counts;
    }
    /* output: accepted records in item order (temp file, then rename) */
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", P.output);
    out = fopen(tmp, "w");
    if (!out) {
        loom_errf(err, "%s: cannot write: %s", tmp, strerror(errno));
        goto done_counts;
    }
    if (P.rejected) {
        rej = fopen(P.rejected, "w");
        if (!rej) {
            loom_errf(err, "%s: cannot write: %s", P.rejected, strerror(errno));
            goto done_counts;
        }
    }
    long long accepted = 0;
    for (int i = 0; i < n_items; i++) {
        item *it = &items[i];
        FILE *f = it->accepted ? out : rej;
        if (!f) continue;
        accepted += it->accepted;
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)fnv1a(P.sd.v[it->seed_idx], P.sd.len[it->seed_idx]));
        size_t tl;
        char *ct = loom_utf8_sanitize(it->text ? it->text : "", it->tlen, &tl);
        json_t *rec = json_pack("{s:s%,s:s,s:i,s:i,s:s,s:{s:s,s:s},s:i,s:O}", "text", ct, tl, "seed_hash", hex,
                                "seed_index", it->seed_idx, "sample", it->sample, "template", P.template_name,
                                "generator", "kind", P.g.http ? "http" : "local", "model", P.g.model,
                                "attempt", it->attempt, "validators", it->results ? it->results : json_array());
        free(ct);
        if (!it->accepted) json_object_set_new(rec, "rejected_by", json_string(it->vmsg));
        char *line = json_dumps(rec, JSON_COMPACT);
        fprintf(f, "%s\n", line);
        free(line);
        json_decref(rec);
    }
    if (fflush(out) || fsync(fileno(out)) || fclose(out)) {
        out = NULL;
        loom_errf(err, "%s: write failed: %s", tmp, strerror(errno));
        goto done_counts;
    }
    out = NULL;
    if (rename(tmp, P.output)) {
        loom_errf(err, "%s: cannot rename into place: %s", P.output, strerror(errno));
        goto done_counts;
    }
    {
        const double dt = loom_now() - t0;
        json_t *rb = json_object(), *hist = json_object();
        for (int v = 0; v < P.nv; v++) json_object_set_new(rb, P.v[v].name, json_integer(rejected_by[v]));
        json_object_set_new(rb, "generator", json_integer(rejected_by[P.nv]));
        for (int a = 1; a <= P.max_attempts; a++) {
            char k[16];
            snprintf(k, sizeof k, "%d", a);
            json_object_set_new(hist, k, json_integer(accepted_at[a]));
        }
        json_t *sum = json_pack("{s:i,s:I,s:I,s:I,s:o,s:o,s:f,s:f,s:f,s:i}", "items", n_items, "accepted",
                                (json_int_t)accepted, "rejected", (json_int_t)(n_items - accepted),
                                "generations", (json_int_t)generated, "rejected_by", rb,
                                "accepted_at_attempt", hist, "seconds", dt, "tokens_per_s",
                                dt > 0 ? (double)tokens / dt : 0.0, "samples_per_s",
                                dt > 0 ? (double)generated / dt : 0.0, "ranks", world);
        if (P.C.on)
            json_object_set_new(sum, "cache", json_pack("{s:s,s:I,s:I,s:I,s:I}", "dir", P.C.dir,
                                "generation_hits", (json_int_t)P.C.gen_hits, "generations_run",
                                (json_int_t)P.C.gen_runs, "validation_hits", (json_int_t)P.C.val_hits,
                                "validations_run", (json_int_t)P.C.val_runs));
        char *s = json_dumps(sum, JSON_COMPACT);
        fprintf(stderr, "synth: %s\n", s);
        if (P.summary && loom_write_file_atomic(P.summary, s, strlen(s), err)) {
            free(s);
            json_decref(sum);
            goto done_counts;
        }
        free(s);
        json_decref(sum);
    }
    rc = 0;
done_counts:
    free(rejected_by);
    free(accepted_at);
    free(pend);
    free(mine);
    free(gen);
done:
    if (out) fclose(out);
    if (rej) fclose(rej);
    for (int i = 0; i < n_items; i++) {
        free(items[i].prompt);
        free(items[i].text);
        json_decref(items[i].results);
        json_decref(items[i].vfresh);
    }
    free(items);
    free(hashes);
    for (int i = 0; i < P.sd.n; i++) free(P.sd.v[i]);
    free(P.sd.v);
    free(P.sd.len);
    for (int i = 0; i < P.nv; i++) {
        if (P.v[i].re) pcre2_code_free(P.v[i].re);
        json_decref(P.v[i].schema);
        for (int j = 0; j < P.v[i].argc; j++) free(P.v[i].argv[j]);
        free(P.v[i].argv);
        if (P.v[i].mh) synth_mh_free(P.v[i].mh);
        free(P.v[i].mh);
        synth_scorer_free(P.v[i].sc);
    }
    if (P.C.on) synth_cache_close(&P.C);
    free(P.gen_id);
    free(P.v);
    for (int i = 0; i < P.g.n_stop; i++) free(P.g.stop[i]);
    loom_chat_template_free(P.g.chat_tpl);
    json_decref(P.g.schema);
    free(P.g.schema_key);
    loom_grammar_unref(P.g.grammar);
    free(P.template_name);
    json_decref(P.root);
    loom_engine_free(L.eng);
    loom_tokenizer_free(L.tok);
    loom_model_free(L.m);
    loom_mesh_free(mesh);
    if (P.g.http) curl_global_cleanup();
    /* under mpirun a failure on one rank ends the job (the others wait in a collective) */
    if (rc && world > 1) {
        if (uniform) loom_comm_fail_all(err);
        loom_comm_fail(err);
    }
    return rc;
}
