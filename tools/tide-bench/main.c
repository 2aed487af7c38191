/*
 * tide-bench - time TIDE-AG and TIDE-RS against the stock FSDP2 layout path.
 *
 *   tide-bench [--fabric cpu|cuda|nccl] [--procs N] [--topology MxL] [--preset NAME | --shapes LIST]
 *              [--divisors 1024,256,64] [--iters N] [--warmup N] [--mode in-place|slot-reuse]
 *              [--grad-dtype bf16|fp32] [--seed S] [--json] [--quiet]
 *              [-b MINBYTES -e MAXBYTES [-f FACTOR]] [--plot FILE.png]
 *
 * Each size divides every parameter's dim 0 by a divisor (the preset's real shapes are too
 * large for a CPU run; --divisors 1 runs them on a GPU).  --fabric cuda (a CUDA build) runs
 * -b/-e/-f sweep the group's size from MINBYTES to MAXBYTES by FACTOR (nccl-tests style;
 * each size divides dim0 by full bytes / target, rounded) instead of --divisors.
 * --plot FILE draws busbw against size for TIDE and the stock path (plot.py, matplotlib).
 * the job on the GPUs: one process drives every rank, or with --procs N (N = M L) one process
 * per rank on the one-process-per-rank fabric.  --fabric nccl (a CUDA build with the NCCL
 * fabric) needs --procs N and N visible GPUs: one process per rank, one GPU each, on the NCCL
 * fabric (M > 1 only with TIDE_NCCL_RAILS=1, docs/nccl-fabric.md).  Exit status: 0 all data
 * correct, 1 a wrong element or a library error, 2 a usage error, a fabric this build lacks
 * or too few GPUs for --fabric nccl.
 */
#include "bench.h"

#include "plan/presets.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: tide-bench [--fabric cpu|cuda|nccl] [--procs N] [--topology MxL]\n"
            "                  [--preset NAME | --shapes LIST]\n"
            "                  [--divisors D1,D2,...] [--iters N] [--warmup N]\n"
            "                  [--mode in-place|slot-reuse] [--grad-dtype bf16|fp32]\n"
            "                  [--seed S] [--json] [--quiet]\n"
            "                  [-b MINBYTES -e MAXBYTES [-f FACTOR]] [--plot FILE.png]\n"
            "sweep: -b/-e/-f as nccl-tests (sizes like 64K, 8M, 1G; factor 2 by default):\n"
            "       each size divides the group's dim0 by full bytes / target (rounded)\n"
            "fabrics: cpu (threads); cuda (CUDA build; one process, or --procs N = M L\n"
            "         processes); nccl (CUDA build with NCCL; --procs N = M L, N GPUs)\n"
            "presets: %s\n",
            tide_preset_names());
}

static int parse_int(const char *s, int lo, int hi, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < lo || v > hi) return 0;
    *out = (int)v;
    return 1;
}

static int parse_divisors(const char *s, bench_opts_t *o) {
    char buf[256];
    if (strlen(s) >= sizeof(buf)) return 0;
    strcpy(buf, s);
    o->num_divisors = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (o->num_divisors == 16 || !parse_int(tok, 1, 1 << 20, &o->divisors[o->num_divisors]))
            return 0;
        o->num_divisors++;
    }
    return o->num_divisors > 0;
}

static int bad_usage(const char *msg) {
    fprintf(stderr, "tide-bench: %s\n", msg);
    usage(stderr);
    return 2;
}

static const char *fabric_name(tide_fabric_kind_t f) {
    return f == TIDE_FABRIC_CPU ? "cpu" : f == TIDE_FABRIC_CUDA ? "cuda" : "nccl";
}

static void print_table(const bench_opts_t *o, const bench_row_t *rows, int n) {
    printf("# tide-bench: fabric %s%s, topology %dx%d (N = %d), %s, mode %s\n",
           fabric_name(o->fabric), o->procs > 0 ? " (one process per rank)" : "", o->nodes, o->gpus_per_node,
           o->nodes * o->gpus_per_node, o->preset ? o->preset : "custom shapes",
           o->mode == TIDE_RS_IN_PLACE ? "in-place" : "slot-reuse");
    /* The stock columns come from C: tide-bench cannot call PyTorch.  On the H200 the GPU
     * stand-in is not within 5% of PyTorch's ops (tests/gpu/bench_torch_baseline.py times both
     * side by side), so the header says what the column is and where the real baseline is. */
    printf("# times are medians of %d iterations; the stock columns are a C stand-in for FSDP2's\n"
           "# layout path on the same buffers (AG: rank-major gather + copy-out; RS: _chunk_cat\n"
           "# fp32 pack + reduce), not PyTorch's ops: tests/gpu/bench_torch_baseline.py times\n"
           "# TIDE, PyTorch's FSDP2 ops and this stand-in side by side\n",
           o->iters);
    if (o->fabric == TIDE_FABRIC_CPU)
        printf("# cpu: TIDE and the stock path alternate which runs first (two iterations each):\n"
               "# their buffers do not fit the cache together, and a fixed order would give one\n"
               "# side the other's evictions in every iteration\n");
    else
        printf("# %s: device buffers; a time runs from the first enqueue to the end of every rank's\n"
               "# work (host clock, devices synchronised before and after)\n",
               fabric_name(o->fabric));
    printf("%-15s %7s %4s %12s %11s %9s %9s %11s %9s %8s %7s\n", "collective", "dim0/", "P",
           "size(B)", "tide(us)", "algbw", "busbw", "stock(us)", "busbw", "speedup", "#wrong");
    for (int i = 0; i < n; ++i) {
        const bench_row_t *r = &rows[i];
        printf("%-15s %7d %4d %12llu %11.1f %9.2f %9.2f %11.1f %9.2f %7.2fx %7llu\n", r->coll,
               r->divisor, r->num_params, (unsigned long long)r->bytes, r->tide_us, r->algbw,
               r->busbw, r->stock_us, r->stock_busbw, r->stock_us / r->tide_us,
               (unsigned long long)r->wrong);
    }
}

/* JSON by hand: tide-bench needs no cJSON, so a GPU machine without it still builds it.  Every
 * string printed is one of ours (no escaping needed) or a preset name ([a-z0-9.-]). */
static void print_json(FILE *f, const bench_opts_t *o, const bench_row_t *rows, int n) {
    fprintf(f, "{\n  \"fabric\": \"%s\",\n  \"procs\": %d,\n  \"nodes\": %d,\n"
           "  \"gpus_per_node\": %d,\n  \"preset\": \"%s\",\n  \"mode\": \"%s\",\n"
           "  \"iters\": %d,\n  \"stock\": \"c-standin\",\n  \"rows\": [",
           fabric_name(o->fabric), o->procs, o->nodes, o->gpus_per_node,
           o->preset ? o->preset : "", o->mode == TIDE_RS_IN_PLACE ? "in-place" : "slot-reuse",
           o->iters);
    for (int i = 0; i < n; ++i) {
        const bench_row_t *r = &rows[i];
        fprintf(f, "%s\n    {\"collective\": \"%s\", \"divisor\": %d, \"params\": %d, "
               "\"bytes\": %llu, \"tide_us\": %.3f, \"stock_us\": %.3f, \"algbw_gbps\": %.4f, "
               "\"busbw_gbps\": %.4f, \"stock_busbw_gbps\": %.4f, \"speedup\": %.4f, "
               "\"wrong\": %llu}",
               i ? "," : "", r->coll, r->divisor, r->num_params, (unsigned long long)r->bytes,
               r->tide_us, r->stock_us, r->algbw, r->busbw, r->stock_busbw,
               r->stock_us / r->tide_us, (unsigned long long)r->wrong);
    }
    fprintf(f, "\n  ]\n}\n");
}

/* --plot: the run's JSON in a temporary file, drawn by plot.py. */
static int plot_rows(const bench_opts_t *o, const bench_row_t *rows, int n) {
    char path[] = "/tmp/tide-bench-XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (f == NULL) {
        fprintf(stderr, "tide-bench: --plot: cannot write a temporary JSON file\n");
        if (fd >= 0) close(fd), unlink(path);
        return 0;
    }
    print_json(f, o, rows, n);
    fclose(f);
    int ok = bench_plot(path, o->plot);
    unlink(path);
    return ok;
}

int main(int argc, char **argv) {
    bench_opts_t o = {.fabric = TIDE_FABRIC_CPU, .nodes = 2, .gpus_per_node = 4,
                      .preset = "llama3-70b-layer", .grad_dtype = TIDE_DTYPE_BF16,
                      .mode = TIDE_RS_IN_PLACE, .divisors = {1024, 256, 64}, .num_divisors = 3,
                      .iters = 5, .warmup = 1, .seed = 0x7A1DE, .step_factor = 2.0};
    static const struct option longopts[] = {
        {"fabric", required_argument, 0, 'X'},   {"topology", required_argument, 0, 't'},
        {"preset", required_argument, 0, 'p'},   {"shapes", required_argument, 0, 's'},
        {"divisors", required_argument, 0, 'd'}, {"iters", required_argument, 0, 'n'},
        {"warmup", required_argument, 0, 'w'},   {"mode", required_argument, 0, 'm'},
        {"grad-dtype", required_argument, 0, 'g'}, {"seed", required_argument, 0, 'S'},
        {"json", no_argument, 0, 'j'},           {"quiet", no_argument, 0, 'q'},
        {"help", no_argument, 0, 'h'},           {"procs", required_argument, 0, 'P'},
        {"minbytes", required_argument, 0, 'b'}, {"maxbytes", required_argument, 0, 'e'},
        {"stepfactor", required_argument, 0, 'f'}, {"plot", required_argument, 0, 'o'},
        {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "hb:e:f:", longopts, NULL)) != -1) {
        switch (c) {
        case 'X':
            if (strcmp(optarg, "cpu") == 0) o.fabric = TIDE_FABRIC_CPU;
            else if (strcmp(optarg, "cuda") == 0) o.fabric = TIDE_FABRIC_CUDA;
            else if (strcmp(optarg, "nccl") == 0) o.fabric = TIDE_FABRIC_NCCL;
            else return bad_usage("--fabric must be cpu, cuda or nccl");
            break;
        case 't':
            if (sscanf(optarg, "%dx%d", &o.nodes, &o.gpus_per_node) != 2 || o.nodes < 1 ||
                o.gpus_per_node < 1 || o.gpus_per_node > TIDE_MAX_GPUS_PER_NODE ||
                o.nodes > 64)
                return bad_usage("--topology must be MxL with 1 <= M <= 64, 1 <= L <= 8");
            break;
        case 'p': o.preset = optarg, o.shapes = NULL; break;
        case 's': o.shapes = optarg, o.preset = NULL; break;
        case 'd':
            if (!parse_divisors(optarg, &o)) return bad_usage("--divisors: up to 16 integers >= 1");
            break;
        case 'n':
            if (!parse_int(optarg, 1, 100000, &o.iters)) return bad_usage("--iters must be >= 1");
            break;
        case 'w':
            if (!parse_int(optarg, 0, 100000, &o.warmup)) return bad_usage("--warmup must be >= 0");
            break;
        case 'm':
            if (strcmp(optarg, "in-place") == 0) o.mode = TIDE_RS_IN_PLACE;
            else if (strcmp(optarg, "slot-reuse") == 0) o.mode = TIDE_RS_SLOT_REUSE;
            else return bad_usage("--mode must be in-place or slot-reuse");
            break;
        case 'g':
            if (strcmp(optarg, "bf16") == 0) o.grad_dtype = TIDE_DTYPE_BF16;
            else if (strcmp(optarg, "fp32") == 0) o.grad_dtype = TIDE_DTYPE_FP32;
            else return bad_usage("--grad-dtype must be bf16 or fp32");
            break;
        case 'S': o.seed = strtoull(optarg, NULL, 0); break;
        case 'P':
            if (!parse_int(optarg, 1, 512, &o.procs)) return bad_usage("--procs must be 1..512");
            break;
        case 'b':
            if (!bench_parse_bytes(optarg, &o.min_bytes)) return bad_usage("-b: a size such as 1M");
            break;
        case 'e':
            if (!bench_parse_bytes(optarg, &o.max_bytes)) return bad_usage("-e: a size such as 64M");
            break;
        case 'f':
            if (sscanf(optarg, "%lf", &o.step_factor) != 1 || !(o.step_factor >= 1.0) ||
                o.step_factor > 1024)
                return bad_usage("-f: a factor in [1, 1024]");
            break;
        case 'o': o.plot = optarg; break;
        case 'j': o.json = true; break;
        case 'q': o.quiet = true; break;
        case 'h': usage(stdout); return 0;
        default: return bad_usage("unknown option");
        }
    }
    if (optind < argc) return bad_usage("unexpected argument");
    /* Usage first, in every build, so that a CPU build checks the same command lines. */
    if (o.procs > 0 && o.fabric == TIDE_FABRIC_CPU)
        return bad_usage("--procs runs one process per rank on a GPU fabric: add --fabric cuda "
                         "or --fabric nccl");
    if (o.fabric == TIDE_FABRIC_NCCL && o.procs == 0)
        return bad_usage("--fabric nccl runs one process per rank: add --procs N (N = M L)");
    if (o.procs > 0 && o.procs != o.nodes * o.gpus_per_node)
        return bad_usage("--procs N needs N = M L ranks of --topology MxL");
#if !TIDE_HAVE_CUDA
    if (o.fabric == TIDE_FABRIC_CUDA) {
        fprintf(stderr, "tide-bench: --fabric cuda needs a CUDA build of TIDE (cmake "
                        "-DTIDE_WITH_CUDA=ON); this build has only the CPU fabric\n");
        return 2;
    }
#endif
#if !TIDE_HAVE_NCCL
    if (o.fabric == TIDE_FABRIC_NCCL) {
        fprintf(stderr, "tide-bench: --fabric nccl needs a CUDA build of TIDE with the NCCL "
                        "fabric (cmake -DTIDE_WITH_CUDA=ON -DTIDE_WITH_NCCL=ON, NCCL >= 2.28 "
                        "headers); this build has no NCCL fabric\n");
        return 2;
    }
#else
    if (o.fabric == TIDE_FABRIC_NCCL) {
        /* NCCL refuses two ranks of one communicator on one GPU: say so before any rank
         * starts, rather than as N failed inits. */
        const int visible = bench_cuda_visible_devices();
        if (visible < o.procs) {
            fprintf(stderr, "tide-bench: --procs %d needs %d GPUs for the NCCL fabric (one per "
                            "rank), %d visible; use --fabric cuda --procs %d to run several "
                            "ranks on one GPU\n",
                    o.procs, o.procs, visible < 0 ? 0 : visible, o.procs);
            return 2;
        }
    }
#endif
    if (o.grad_dtype != TIDE_DTYPE_BF16)
        return bad_usage("the stock baseline here packs bf16 gradients: --grad-dtype bf16");

    const tide_param_shape_t *shapes;
    tide_param_shape_t *parsed = NULL;
    int P;
    if (o.preset) {
        const tide_preset_t *pr = tide_preset_find(o.preset);
        if (!pr) return bad_usage("unknown preset");
        shapes = pr->shapes, P = pr->num_params;
    } else {
        if (tide_shapes_parse(o.shapes, &parsed, &P) != TIDE_SUCCESS)
            return bad_usage(tide_get_last_error());
        shapes = parsed;
    }
    if ((o.min_bytes != 0) != (o.max_bytes != 0) || o.min_bytes > o.max_bytes) {
        free(parsed);
        return bad_usage("a sweep needs -b MINBYTES and -e MAXBYTES >= MINBYTES");
    }
    if (o.min_bytes != 0 && !bench_sweep_divisors(&o, shapes, P)) {
        free(parsed);
        return 2;
    }
    bench_row_t rows[2 * BENCH_MAX_SIZES];
    int n = 0;
    tide_result_t r;
#if TIDE_HAVE_CUDA
    if (o.fabric != TIDE_FABRIC_CPU)
        r = o.procs > 0 ? bench_run_cuda_procs(&o, shapes, P, rows, &n)
                        : bench_run_cuda(&o, shapes, P, rows, &n);
    else
#endif
        r = bench_run_cpu(&o, shapes, P, rows, &n);
    free(parsed);
    if (o.json) print_json(stdout, &o, rows, n);
    else print_table(&o, rows, n);
    if (r != TIDE_SUCCESS) {
        fprintf(stderr, "tide-bench: %s: %s\n", tide_get_error_string(r), tide_get_last_error());
        return 1;
    }
    if (o.plot != NULL && !plot_rows(&o, rows, n)) return 1;
    uint64_t wrong = 0;
    for (int i = 0; i < n; ++i) wrong += rows[i].wrong;
    if (wrong) {
        fprintf(stderr, "tide-bench: %llu wrong elements\n", (unsigned long long)wrong);
        return 1;
    }
    return 0;
}
