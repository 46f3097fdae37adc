/* Link stand-ins for the model functions src/ckpt/ckpt_pieces.c calls from
 * loom_pieces_load_params, which the fuzz targets never use (they call loom_pieces_fill with
 * pieces of their own). The fuzz build compiles only base, data and the checkpoint files, so
 * nothing else defines them; reaching one is a harness bug. */
#include <stdio.h>
#include <stdlib.h>

#include "loom/model.h"

int loom_model_num_tensors(const loom_model *m) {
    (void)m;
    fprintf(stderr, "fuzz: loom_model_num_tensors is a stub\n");
    abort();
}
const loom_tensor_info *loom_model_tensor(const loom_model *m, int i) {
    (void)m;
    (void)i;
    fprintf(stderr, "fuzz: loom_model_tensor is a stub\n");
    abort();
}
float *loom_model_params(loom_model *m) {
    (void)m;
    fprintf(stderr, "fuzz: loom_model_params is a stub\n");
    abort();
}
size_t loom_model_num_params(const loom_model *m) {
    (void)m;
    fprintf(stderr, "fuzz: loom_model_num_params is a stub\n");
    abort();
}
const struct loom_backend *loom_model_backend(const loom_model *m) {
    (void)m;
    fprintf(stderr, "fuzz: loom_model_backend is a stub\n");
    abort();
}
