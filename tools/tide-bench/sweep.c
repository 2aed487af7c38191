/*
 * sweep.c - tide-bench: nccl-tests-style size sweeps (-b min bytes, -e max bytes, -f factor)
 * and --plot (busbw against size, drawn by plot.py from the run's JSON).
 *
 * The sizes of tide-bench are a parameter group scaled down: every dim0 divided by a divisor.
 * A sweep therefore picks, for each target size b, b f, b f^2, ... <= e, the divisor full
 * group bytes / target (rounded).  A row's `size(B)` is the scaled group's real size, which
 * can exceed the target at small sizes: every dim0 rounds up and shards are padded to N rows.
 */
#include "bench.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int bench_parse_bytes(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno != 0 || v <= 0) return 0;
    double mul = 1;
    switch (*end) {
    case 'K': case 'k': mul = 1024.0, ++end; break;
    case 'M': case 'm': mul = 1048576.0, ++end; break;
    case 'G': case 'g': mul = 1073741824.0, ++end; break;
    default: break;
    }
    if (*end != '\0' || v * mul > 1e18) return 0;
    *out = (uint64_t)(v * mul);
    return *out > 0;
}

int bench_sweep_divisors(bench_opts_t *o, const tide_param_shape_t *shapes, int num_shapes) {
    /* Bytes of the full group in the weights' dtype (bf16): what divisor 1 gathers. */
    double full = 0;
    for (int p = 0; p < num_shapes; ++p) full += 2.0 * (double)shapes[p].dim0 * (double)shapes[p].inner;
    o->num_divisors = 0;
    double last = 0;
    for (double b = (double)o->min_bytes; b <= (double)o->max_bytes * 1.0000001;
         b *= o->step_factor) {
        double d = full / b;
        int div = d < 1 ? 1 : d > (1 << 20) ? 1 << 20 : (int)lround(d);
        if (div == last) continue; /* two targets that round to one group */
        if (o->num_divisors == BENCH_MAX_SIZES) {
            fprintf(stderr, "tide-bench: -b/-e/-f asks for more than %d sizes\n", BENCH_MAX_SIZES);
            return 0;
        }
        o->divisors[o->num_divisors++] = div;
        last = div;
        if (o->step_factor <= 1.0) break;
    }
    return o->num_divisors > 0;
}

int bench_plot(const char *json_path, const char *png_path) {
    const char *script = getenv("TIDE_BENCH_PLOT");
#ifdef TIDE_BENCH_PLOT_SCRIPT
    if (script == NULL) script = TIDE_BENCH_PLOT_SCRIPT;
#endif
    if (script == NULL || access(script, R_OK) != 0) {
        fprintf(stderr, "tide-bench: --plot: the drawing script %s is missing; set TIDE_BENCH_PLOT "
                        "to tools/tide-bench/plot.py of the source tree\n",
                script ? script : "(none)");
        return 0;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "tide-bench: --plot: fork failed: %s\n", strerror(errno));
        return 0;
    }
    if (pid == 0) {
        execlp("python3", "python3", script, json_path, png_path, (char *)NULL);
        fprintf(stderr, "tide-bench: --plot needs python3 with matplotlib: %s\n", strerror(errno));
        _exit(127);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return 0;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}
