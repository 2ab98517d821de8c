/*
 * cma_bench: how fast the threads of one process copy another process's
 * memory with cross-memory attach (process_vm_readv), beside memcpy of the
 * same blocks by as many threads in the same run: the ceiling of the
 * shared-memory transport for caller memory (malloc'd or mmap'd buffers,
 * which no other process can map), whose bytes the kernel copies this way
 * in calls of at most 256 KiB (several small requests in one call).
 *
 * The parent forks a child that holds a source buffer of 256 MiB (or
 * --block x --threads bytes, if more), every page written, and waits.
 * Then --threads threads of the parent copy --block bytes at a time from
 * it into the parent's own buffer, for --duration seconds: thread t copies
 * block i*threads+t of the ring (wrapping), as transfer_bench's threads
 * take their requests, so that they walk the same page tables at once as
 * an engine's threads do; then the same with memcpy (whole blocks) from
 * the parent's own copy of the source. With --layout apart, thread t
 * instead walks its own part of the ring (block t*slots/threads, then
 * the next, ...), so that no two threads copy within the same page-table
 * page at once: whether they slow each other down there shows as the
 * difference between the two layouts. Prints one line:
 *
 *   cma: block=1048576 threads=2 layout=interleaved process_vm_readv=9.71 GB/s memcpy=14.52 GB/s ratio=0.67
 *
 * GB/s is 1e9 bytes per second, summed over the threads. Usage:
 *   cma_bench [--block BYTES] [--duration S] [--piece BYTES] [--threads N]
 *             [--layout interleaved|apart]
 */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MIN_RING (256ul << 20)
#define MAX_THREADS 1024

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* What every thread of one timed run shares. */
struct plan {
    pid_t child; /* > 0: process_vm_readv from it; else memcpy */
    char *src, *dst;
    size_t ring, block, piece;
    int threads;
    int apart; /* each thread its own part of the ring */
    double duration;
};

struct worker {
    const struct plan *plan;
    int index;
    pthread_t tid;
    uint64_t bytes;
};

/* Where the i-th block thread t copies lies in the ring: block i*threads+t
 * (wrapping), or with --layout apart, block i of the thread's own part. */
static size_t block_offset(const struct plan *p, int t, uint64_t i) {
    uint64_t slots = p->ring / p->block;
    if (p->apart) {
        uint64_t part = slots / (uint64_t)p->threads;
        return (size_t)((uint64_t)t * part + i % part) * p->block;
    }
    return (size_t)((i * (uint64_t)p->threads + (uint64_t)t) % slots) * p->block;
}

/* Copies the thread's blocks (block_offset) for the plan's duration: with
 * process_vm_readv in calls of at most `piece` bytes (several blocks per
 * call when they fit, up to IOV_MAX, as the transport groups small
 * requests), else with memcpy of each block. */
static void *copy_blocks(void *arg) {
    enum { MAX_IOV = 1024 };
    struct worker *w = arg;
    const struct plan *p = w->plan;
    struct iovec local[MAX_IOV], remote[MAX_IOV];
    size_t per_call = p->block >= p->piece ? 1 : p->piece / p->block;
    if (per_call > MAX_IOV) per_call = MAX_IOV;
    uint64_t i = 0;
    double t0 = now();
    do {
        for (int round = 0; round < 16; round++) {
            if (p->child <= 0 || per_call == 1) {
                size_t off = block_offset(p, w->index, i++);
                if (p->child <= 0) {
                    memcpy(p->dst + off, p->src + off, p->block);
                } else {
                    for (size_t q = 0; q < p->block; q += p->piece) {
                        size_t n = p->block - q < p->piece ? p->block - q : p->piece;
                        local[0] = (struct iovec){p->dst + off + q, n};
                        remote[0] = (struct iovec){p->src + off + q, n};
                        if (process_vm_readv(p->child, local, 1, remote, 1, 0) != (ssize_t)n) {
                            perror("cma_bench: process_vm_readv");
                            exit(1);
                        }
                    }
                }
                w->bytes += p->block;
                continue;
            }
            for (size_t k = 0; k < per_call; k++) {
                size_t off = block_offset(p, w->index, i++);
                local[k] = (struct iovec){p->dst + off, p->block};
                remote[k] = (struct iovec){p->src + off, p->block};
            }
            ssize_t want = (ssize_t)(per_call * p->block);
            if (process_vm_readv(p->child, local, per_call, remote, per_call, 0) != want) {
                perror("cma_bench: process_vm_readv");
                exit(1);
            }
            w->bytes += (uint64_t)want;
        }
    } while (now() - t0 < p->duration);
    return NULL;
}

/* GB/s of the plan's threads together. */
static double run(const struct plan *p) {
    static struct worker workers[MAX_THREADS];
    double t0 = now();
    for (int t = 0; t < p->threads; t++) {
        workers[t] = (struct worker){.plan = p, .index = t};
        if (pthread_create(&workers[t].tid, NULL, copy_blocks, &workers[t]) != 0) {
            fprintf(stderr, "cma_bench: cannot start thread %d\n", t);
            exit(1);
        }
    }
    uint64_t bytes = 0;
    for (int t = 0; t < p->threads; t++) {
        pthread_join(workers[t].tid, NULL);
        bytes += workers[t].bytes;
    }
    return (double)bytes / (now() - t0) / 1e9;
}

/* The usage line, on stderr; the exit code of a bad command line. */
static int usage(void) {
    fprintf(stderr, "usage: cma_bench [--block BYTES] [--duration S] [--piece BYTES] [--threads N]"
                    " [--layout interleaved|apart]\n");
    return 2;
}

int main(int argc, char **argv) {
    size_t block = 1u << 20, piece = 256u << 10;
    double duration = 1;
    long threads = 1;
    int apart = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--block")) block = (size_t)atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--duration")) duration = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--piece")) piece = (size_t)atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--layout") && !strcmp(argv[i + 1], "interleaved")) apart = 0;
        else if (!strcmp(argv[i], "--layout") && !strcmp(argv[i + 1], "apart")) apart = 1;
        else return usage();
    }
    if (argc % 2 == 0) return usage();
    if (block < 1 || block > (1ul << 30) || piece < 1 || duration <= 0 || threads < 1 ||
        threads > MAX_THREADS) {
        fprintf(stderr, "cma_bench: block 1..1 GiB, piece >= 1, duration > 0, threads 1..%d\n", MAX_THREADS);
        return 2;
    }
    size_t ring = block * (size_t)threads > MIN_RING ? block * (size_t)threads : MIN_RING;
    char *src = mmap(NULL, ring, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *dst = mmap(NULL, ring, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (src == MAP_FAILED || dst == MAP_FAILED) {
        perror("cma_bench: mmap");
        return 1;
    }
    memset(src, 0x5a, ring);
    int ready[2];
    if (pipe(ready) != 0) {
        perror("cma_bench: pipe");
        return 1;
    }
    pid_t child = fork();
    if (child < 0) {
        perror("cma_bench: fork");
        return 1;
    }
    if (child == 0) {
        /* Its own copy of the source, every page of it written. */
        memset(src, 0xa5, ring);
        if (write(ready[1], "", 1) != 1) _exit(1);
        for (;;) pause();
    }
    char c;
    if (read(ready[0], &c, 1) != 1) {
        fprintf(stderr, "cma_bench: the child died\n");
        return 1;
    }
    /* Written after the fork, so that no page of it is shared with the
     * child (copy on write) when the copies land in it. */
    memset(dst, 0, ring);
    struct plan p = {.child = child, .src = src, .dst = dst, .ring = ring, .block = block, .piece = piece,
                     .threads = (int)threads, .apart = apart, .duration = duration};
    double cma = run(&p);
    /* memcpy copies each block whole, as local_bench's baseline does. */
    p.child = 0;
    double mem = run(&p);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    printf("cma: block=%zu threads=%ld layout=%s process_vm_readv=%.2f GB/s memcpy=%.2f GB/s ratio=%.2f\n", block,
           threads, apart ? "apart" : "interleaved", cma, mem, cma / mem);
    return 0;
}
