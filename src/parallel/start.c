/* Process start-up (include/loom/parallel.h, loom_parallel_start): the mesh's world, then the
 * kernels' instruction-set level agreed over it. Here, above both comm and the kernels, so that
 * neither depends on the other (docs/architecture.md). */
#include "loom/backend.h"
#include "loom/comm.h"
#include "loom/parallel.h"

/* Levels differ in bits (FMA contraction, in-row reduction widths), so every rank runs the
 * minimum. One allreduce also carries a refused LOOM_ISA (so no rank waits for another that
 * failed) and the maximum (to say when the ranks differ). */
static int agree_isa(loom_err *err) {
    loom_err mine;
    const int ok = loom_isa_init(&mine) == 0;
    const int level = ok ? (int)loom_isa_active() : 99;
    int lo, hi, all_ok;
    if (loom_comm_world_agree(level, ok, &lo, &hi, &all_ok, err))
        return loom_err_prefix(err, "kernels: agreeing on the instruction-set level");
    if (!ok) {
        *err = mine;
        return loom_err_prefix(err, "rank %d", loom_comm_world_rank());
    }
    if (!all_ok) return loom_errf(err, "kernels: another rank refused its LOOM_ISA (see its message)");
    if (loom_isa_set((loom_isa)lo, err) != 0) return -1;
    if (loom_comm_world_rank() == 0 && lo != hi)
        loom_log("kernels: the ranks' CPUs support different levels (%s to %s): every rank runs "
                 "the %s kernels, so replicas stay bit-identical", loom_isa_name((loom_isa)lo),
                 loom_isa_name((loom_isa)hi), loom_isa_name((loom_isa)lo));
    return 0;
}

int loom_parallel_start(int *argc, char ***argv, loom_err *err) {
    if (loom_comm_init(argc, argv, err)) return -1;
    return loom_comm_mpi_active() ? agree_isa(err) : 0;
}
