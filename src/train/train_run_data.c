/* The trainer's side of the run's data record (include/loom/load.h, src/ckpt/run_data.c):
 * opened from data.train, and checked against a checkpoint's on resume. */
#include <string.h>

#include "loom/load.h"
#include "train/trainer_internal.h"

/* ---- the trainer --------------------------------------------------------------------------- */

int loom_trainer_open_run_data(trainer *t, loom_err *err) {
    if (loom_run_data_from_dataset(t->train_ds, t->s.train_dir, t->classify, &t->run_data, err))
        return loom_err_prefix(err, "data.train");
    if (t->val_ds && loom_run_data_check_dataset(t->run_data, t->val_ds, t->s.val_dir, err))
        return loom_err_prefix(err, "data.val");
    if (t->val_ds && t->classify && loom_run_data_check_classes(t->run_data, t->s.val_dir, err))
        return loom_err_prefix(err, "data.val");
    return 0;
}

int loom_trainer_check_run_data(const trainer *t, const loom_ckpt *ck, loom_err *err) {
    size_t len;
    if (!loom_ckpt_file_data(ck, LOOM_RUN_DATA_FILE, &len)) return 0; /* older: nothing recorded */
    loom_run_data *saved = NULL;
    if (loom_run_data_read(ck, t->cfg, &saved, err)) return -1;
    int rc = 0;
    if (strcmp(saved->tokenizer_id, t->run_data->tokenizer_id) != 0)
        rc = loom_errf(err, "data.train %s was tokenized with %s, but the checkpoint being resumed "
                            "with %s (%s): a run continues on data of its own tokenizer",
                       t->s.train_dir, t->run_data->tokenizer_id, saved->tokenizer_id,
                       saved->where);
    else if (t->classify && loom_run_data_check_classes(saved, t->s.train_dir, err))
        rc = loom_err_prefix(err, "data.train");
    loom_run_data_free(saved);
    return rc;
}
