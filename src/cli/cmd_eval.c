/* loom eval CKPT --data DIR [--batches N] [--format text|json]
 *
 * LM checkpoints: mean loss and perplexity over every window of DIR once (N = 0, the default), or
 * over the first N batches of DIR's weighted mixture.
 * Classify checkpoints: every window of DIR once (the checkpoint's windows_per_doc), loss,
 * accuracy, the majority-class baseline and the confusion matrix (rows: true class). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "loom/data.h"
#include "loom/load.h"
#include "loom/windows.h"

static int usage(void) {
    fprintf(stderr, "usage: loom eval CKPT --data DIR [--batches N] [--format text|json]\n");
    return 2;
}

static int cfg_int(loom_config *c, const char *k, int64_t *v, loom_err *err) {
    return loom_config_get_int(c, k, v, err);
}

/* classification: all windows once */
static int eval_classify(loom_model *m, loom_config *cfg, loom_dataset *ds, const char *dir,
                         int json_out, loom_err *err) {
    int64_t B, T, per_doc, pad, seed;
    if (cfg_int(cfg, "training.batch_size", &B, err) || cfg_int(cfg, "training.seq_len", &T, err) ||
        cfg_int(cfg, "data.windows_per_doc", &per_doc, err) ||
        cfg_int(cfg, "data.pad_id", &pad, err) || cfg_int(cfg, "training.seed", &seed, err))
        return -1;
    char **names = NULL;
    int n_names = 0;
    if (loom_dataset_classes(dir, &names, &n_names, err)) return -1;
    const int K = loom_model_get_config(m)->num_classes;
    loom_windows *w = NULL;
    if (loom_windows_open(ds, (int)T, (int)per_doc, (uint64_t)seed, 0, (int)pad, &w, err)) {
        loom_free_strings(names, n_names);
        return -1;
    }
    const uint64_t total = loom_windows_per_epoch(w);
    int32_t *inp = loom_malloc((size_t)(B * T) * sizeof(int32_t));
    int32_t *lab = loom_malloc((size_t)B * sizeof(int32_t));
    int64_t *conf = loom_calloc((size_t)K * (size_t)K, sizeof(int64_t));
    float *lgb = loom_malloc((size_t)B * (size_t)K * sizeof(float)); /* the logits read back */
    double loss_sum = 0;
    int64_t n = 0, correct = 0;
    for (uint64_t done = 0; done < total; done += (uint64_t)B) {
        const int nb = total - done < (uint64_t)B ? (int)(total - done) : (int)B;
        loom_windows_next(w, nb, inp, lab);
        for (int b = 0; b < nb; b++) /* windows_open checked them against dataset.json */
            LOOM_CHECK(lab[b] >= 0 && lab[b] < K);
        for (int b = nb; b < B; b++) lab[b] = -1; /* a short last batch */
        const float loss = loom_model_forward(m, inp, lab, nb, (int)T);
        loss_sum += (double)loss * nb;
        float *lg = lgb;
        loom_model_read_logits(m, lg, 0, (size_t)nb * (size_t)K);
        for (int b = 0; b < nb; b++) {
            int best = 0;
            for (int k = 1; k < K; k++)
                if (lg[b * K + k] > lg[b * K + best]) best = k;
            conf[(size_t)lab[b] * K + best]++;
            correct += best == lab[b];
            n++;
        }
    }
    int64_t majority = 0;
    for (int i = 0; i < K; i++) {
        int64_t row = 0;
        for (int j = 0; j < K; j++) row += conf[(size_t)i * K + j];
        if (row > majority) majority = row;
    }
    const double acc = (double)correct / (double)n, base = (double)majority / (double)n;
    if (json_out) {
        json_t *o = json_pack("{s:s, s:I, s:f, s:f, s:f}", "data", dir, "windows", (json_int_t)n,
                              "loss", loss_sum / (double)n, "accuracy", acc, "majority_baseline",
                              base);
        json_t *cn = json_array(), *cm = json_array();
        for (int i = 0; i < K; i++) {
            json_array_append_new(cn, json_string(i < n_names ? names[i] : "(unused)"));
            json_t *row = json_array();
            for (int j = 0; j < K; j++) json_array_append_new(row, json_integer(conf[(size_t)i * K + j]));
            json_array_append_new(cm, row);
        }
        json_object_set_new(o, "classes", cn);
        json_object_set_new(o, "confusion", cm);
        char *s = json_dumps(o, JSON_INDENT(2));
        puts(s);
        free(s);
        json_decref(o);
    } else {
        printf("%s: %lld windows, loss %.4f, accuracy %.4f (majority class %.4f)\n", dir,
               (long long)n, loss_sum / (double)n, acc, base);
        printf("confusion matrix (rows: true class, columns: predicted)\n%18s", "");
        for (int j = 0; j < n_names && j < K; j++) printf(" %5d", j);
        putchar('\n');
        for (int i = 0; i < n_names && i < K; i++) {
            printf("%2d %-15.15s", i, names[i]);
            for (int j = 0; j < n_names && j < K; j++) printf(" %5lld", (long long)conf[(size_t)i * K + j]);
            putchar('\n');
        }
    }
    free(inp);
    free(lab);
    free(conf);
    free(lgb);
    loom_windows_free(w);
    loom_free_strings(names, n_names);
    return 0;
}

/* LM: batches = 0: every window of DIR exactly once (loom_loader_pass_slice: the sources in
 * manifest order, the last batch short); batches > 0: the first N batches of DIR's weighted
 * mixture, unshuffled. The loss is the mean over every target evaluated. */
static int eval_lm(loom_model *m, loom_config *cfg, loom_dataset *ds, const char *dir,
                   int64_t batches, int json_out, loom_err *err) {
    int64_t B, T, seed;
    if (cfg_int(cfg, "training.batch_size", &B, err) || cfg_int(cfg, "training.seq_len", &T, err) ||
        cfg_int(cfg, "training.seed", &seed, err))
        return -1;
    const loom_loader_opts o = {.T = (int)T, .seed = (uint64_t)seed, .shuffle = 0, .ignore_caps = 1};
    loom_loader *l = NULL;
    if (loom_loader_open(ds, &o, &l, err)) return -1;
    const int pass = batches == 0;
    if (pass) batches = (int64_t)loom_loader_pass_batches(l, (int)B);
    int32_t *inp = loom_malloc((size_t)(B * T) * sizeof(int32_t));
    int32_t *tgt = loom_malloc((size_t)(B * T) * sizeof(int32_t));
    /* model.doc_mask: the windows' documents, as in training */
    int32_t *docs = loom_model_get_config(m)->doc_mask
                        ? loom_malloc((size_t)(B * T) * sizeof(int32_t))
                        : NULL;
    double sum = 0;
    int64_t valid = 0, windows = 0;
    int rc = 0;
    for (int64_t b = 0; b < batches && rc == 0; b++) {
        if (pass)
            windows += loom_loader_pass_slice_docs(l, (uint64_t)b, (int)B, 0, 1, inp, tgt, docs);
        else if ((rc = loom_loader_next_docs(l, (int)B, 0, 1, inp, tgt, docs, err)) == 0)
            windows += B;
        if (rc == 0) {
            if (docs) loom_model_set_docs(m, NULL, docs, (int)B, (int)T);
            const float loss = loom_model_forward(m, inp, tgt, (int)B, (int)T);
            const int64_t v = loom_model_valid_targets(m);
            sum += (double)loss * (double)v;
            valid += v;
        }
    }
    if (rc == 0) {
        const double loss = valid > 0 ? sum / (double)valid : 0.0;
        if (json_out) {
            json_t *jo = json_pack("{s:s, s:s, s:I, s:I, s:I, s:f, s:f}", "data", dir, "mode",
                                   pass ? "pass" : "mixture", "windows", (json_int_t)windows,
                                   "batches", (json_int_t)batches, "tokens", (json_int_t)valid,
                                   "loss", loss, "perplexity", exp(loss));
            char *text = jo ? json_dumps(jo, JSON_COMPACT) : NULL;
            LOOM_CHECK(text != NULL);
            puts(text);
            free(text);
            json_decref(jo);
        } else {
            printf("%s: %lld windows of %lld tokens (%s, %lld batches of %lld), loss %.4f, "
                   "perplexity %.3f\n",
                   dir, (long long)windows, (long long)T,
                   pass ? "every window once" : "the first batches of the mixture",
                   (long long)batches, (long long)B, loss, exp(loss));
        }
    }
    free(inp);
    free(tgt);
    free(docs);
    loom_loader_free(l);
    return rc;
}

int loom_cli_eval(int argc, char **argv) {
    const char *ckpt = NULL, *data = NULL;
    long long batches = 0;
    int json_out = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-') {
            if (ckpt) return usage();
            ckpt = a;
        } else if (i + 1 >= argc) {
            return usage();
        } else if (!strcmp(a, "--data")) {
            data = argv[++i];
        } else if (!strcmp(a, "--batches")) {
            char *end;
            batches = strtoll(argv[++i], &end, 10);
            if (*end || end == argv[i] || batches < 0) {
                fprintf(stderr, "loom: error: --batches '%s' is not a non-negative integer\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "--format")) {
            const char *f = argv[++i];
            if (!strcmp(f, "json")) json_out = 1;
            else if (strcmp(f, "text")) return usage();
        } else {
            return usage();
        }
    }
    if (!ckpt || !data) return usage();
    loom_err err = {{0}};
    loom_model *m = NULL;
    loom_config *cfg = NULL;
    loom_dataset *ds = NULL;
    loom_run_data *run = NULL;
    int rc = 1;
    /* the model is built for the run's batch size and training sequence length */
    if (loom_load_model_ex(ckpt, 0, 1, &m, &cfg, &run, &err)) goto out;
    if (loom_dataset_open(data, &ds, &err)) goto out;
    /* the data must be tokenized (and, for a classifier, labelled) as the model's was */
    if (loom_run_data_check_dataset(run, ds, data, &err)) goto out;
    if (loom_model_get_config(m)->head == LOOM_HEAD_CLASSIFY &&
        loom_run_data_check_classes(run, data, &err))
        goto out;
    if (loom_dataset_vocab_size(ds) > (uint32_t)loom_model_get_config(m)->vocab_size) {
        loom_errf(&err, "%s: vocabulary size %u is larger than the model's %d", data,
                  loom_dataset_vocab_size(ds), loom_model_get_config(m)->vocab_size);
        goto out;
    }
    rc = loom_model_get_config(m)->head == LOOM_HEAD_CLASSIFY
             ? eval_classify(m, cfg, ds, data, json_out, &err)
             : eval_lm(m, cfg, ds, data, batches, json_out, &err);
    rc = rc ? 1 : 0;
out:
    if (rc) fprintf(stderr, "loom: error: %s\n", err.msg);
    loom_dataset_close(ds);
    loom_model_free(m);
    loom_config_free(cfg);
    loom_run_data_free(run);
    return rc;
}
