/* The model.* section of a config: its keys (for the schema) and the conversion. */
#ifndef LOOM_MODEL_CONFIG_H
#define LOOM_MODEL_CONFIG_H

#include "loom/config.h"
#include "loom/model.h"

extern const loom_config_key loom_model_config_keys[];
extern const int loom_model_config_nkeys;

/* Reads model.* (after the schema has applied defaults). default_seq_len is used when
 * model.max_seq_len is absent. Errors name the key and where it was set. */
int loom_model_config_from(const loom_config *c, int default_seq_len, loom_model_config *out,
                           loom_err *err);

/* Writes model.flavor (a->name, a built-in descriptor) and the model.arch.* keys where a
 * differs from it (what loom_model_config_from reads back as a). */
void loom_arch_config_set(loom_config *c, const loom_arch *a, const char *origin);

#endif
