/* The MPI test drivers' (comm_driver.c, tp_driver.c) check: EXPECT(cond, fmt, ...) prints
 * "rank R: FAIL file:line: message" on stderr and marks the run failed (g_fail, the driver's exit
 * status) without stopping it, so every failed check of every rank is reported. */
#ifndef LOOM_TESTS_DRIVER_EXPECT_H
#define LOOM_TESTS_DRIVER_EXPECT_H

#include <stdio.h>

#include "loom/comm.h"

static int g_fail;
#define EXPECT(cond, ...)                                                                    \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "rank %d: FAIL %s:%d: ", loom_comm_world_rank(), __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                                    \
            fputc('\n', stderr);                                                             \
            g_fail = 1;                                                                      \
        }                                                                                    \
    } while (0)

#endif
