/*
 * cma_bench: how fast the threads of one process copy another process's
 * memory in 4 KiB pages, beside memcpy of the same blocks by as many
 * threads in the same run: the ceiling of the shared-memory transport for
 * caller memory (malloc'd or mmap'd buffers, which no other process can
 * map). --method picks which of the kernel's ways between processes:
 *
 *   readv     cross-memory attach (process_vm_readv), the transport's way,
 *             in calls of at most --piece bytes (several small blocks in
 *             one call, as the transport groups small requests);
 *   vmsplice  the child hands its pages to a pipe per thread (vmsplice)
 *             and the parent's thread reads them out (the kernel copies
 *             while the child's thread references the next pages);
 *   pread     the source is a memfd the child wrote (shared memory in
 *             4 KiB pages) and the parent reads it with pread.
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
 * difference between the two layouts. Every byte the copies left in the
 * parent's buffer is checked to be the child's. Prints one line, naming
 * the method by its call:
 *
 *   cma: block=1048576 threads=2 layout=interleaved process_vm_readv=9.71 GB/s memcpy=14.52 GB/s ratio=0.67
 *
 * GB/s is 1e9 bytes per second, summed over the threads. Usage:
 *   cma_bench [--block BYTES] [--duration S] [--piece BYTES] [--threads N]
 *             [--layout interleaved|apart] [--method readv|vmsplice|pread]
 */
#include <errno.h>
#include <fcntl.h>
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
/* Two pipe descriptors per thread with --method vmsplice. */
#define MAX_PIPE_THREADS 256
/* The byte at offset i of the child's source: it differs from page to
 * page, so that a block copied to another place shows. The parent's own
 * copy of the source holds each byte's complement. */
static unsigned char child_byte(size_t i) {
    return (unsigned char)((i >> 12) * 31 + (i >> 20) * 7 + i + 0xa5);
}

/* Writes the source pattern, or its complement, into `len` bytes. */
static void fill(char *buf, size_t len, int complement) {
    for (size_t i = 0; i < len; i++) buf[i] = (char)(child_byte(i) ^ (complement ? 0xff : 0));
}

enum method { READV, VMSPLICE, PREAD };
static const char *const method_call[] = {"process_vm_readv", "vmsplice", "pread"};

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* What every thread of one timed run shares. */
struct plan {
    pid_t child; /* > 0: copy from it by `method`; else memcpy */
    enum method method;
    int (*pipes)[2]; /* vmsplice: thread t reads pipes[t][0] */
    int memfd;       /* pread: the child's source */
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

/* Reads exactly `len` bytes from pipe `fd` into `dst`, or exits. */
static void read_pipe(int fd, char *dst, size_t len) {
    for (size_t got = 0; got < len;) {
        ssize_t n = read(fd, dst + got, len - got);
        if (n <= 0) {
            fprintf(stderr, "cma_bench: read from the pipe: %s\n", n ? strerror(errno) : "the child closed it");
            exit(1);
        }
        got += (size_t)n;
    }
}

/* Reads exactly `len` bytes at `off` of file `fd` into `dst`, or exits. */
static void pread_all(int fd, char *dst, size_t len, size_t off) {
    for (size_t got = 0; got < len;) {
        ssize_t n = pread(fd, dst + got, len - got, (off_t)(off + got));
        if (n <= 0) {
            fprintf(stderr, "cma_bench: pread: %s\n", n ? strerror(errno) : "short file");
            exit(1);
        }
        got += (size_t)n;
    }
}

/* Copies block `off` whole from the child by the plan's method (vmsplice:
 * the child's thread has put that block into this thread's pipe). */
static void copy_whole(const struct plan *p, int t, size_t off) {
    if (p->method == VMSPLICE) read_pipe(p->pipes[t][0], p->dst + off, p->block);
    else pread_all(p->memfd, p->dst + off, p->block, off);
}

/* Copies the thread's blocks (block_offset) for the plan's duration: with
 * process_vm_readv in calls of at most `piece` bytes (several blocks per
 * call when they fit, up to IOV_MAX, as the transport groups small
 * requests), with the other methods a block at a time, else with memcpy
 * of each block. */
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
            if (p->child <= 0 || per_call == 1 || p->method != READV) {
                size_t off = block_offset(p, w->index, i++);
                if (p->child <= 0) {
                    memcpy(p->dst + off, p->src + off, p->block);
                } else if (p->method != READV) {
                    copy_whole(p, w->index, off);
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
                    " [--layout interleaved|apart] [--method readv|vmsplice|pread]\n");
    return 2;
}

/* What a thread of the child does with --method vmsplice: puts its
 * blocks, in the order the parent's thread of the same index takes them,
 * into that thread's pipe, until the parent kills the child. */
struct splicer {
    const struct plan *plan;
    int index;
    pthread_t tid;
};

static void *splice_blocks(void *arg) {
    const struct splicer *s = arg;
    const struct plan *p = s->plan;
    for (uint64_t i = 0;; i++) {
        size_t off = block_offset(p, s->index, i);
        for (size_t done = 0; done < p->block;) {
            struct iovec v = {p->src + off + done, p->block - done};
            ssize_t n = vmsplice(p->pipes[s->index][1], &v, 1, 0);
            if (n <= 0) {
                perror("cma_bench: vmsplice");
                _exit(1);
            }
            done += (size_t)n;
        }
    }
    return NULL;
}

/* The child: writes its own copy of the source (in the memfd with
 * --method pread), says so on `ready`, and waits to be killed; with
 * --method vmsplice its threads feed the pipes meanwhile. */
static void child_main(const struct plan *p, int ready) {
    char *src = p->src;
    if (p->method == PREAD) {
        src = mmap(NULL, p->ring, PROT_READ | PROT_WRITE, MAP_SHARED, p->memfd, 0);
        if (src == MAP_FAILED) _exit(1);
    }
    fill(src, p->ring, 0);
    if (write(ready, "", 1) != 1) _exit(1);
    if (p->method == VMSPLICE) {
        static struct splicer splicers[MAX_PIPE_THREADS];
        for (int t = 0; t < p->threads; t++) {
            splicers[t] = (struct splicer){.plan = p, .index = t};
            if (pthread_create(&splicers[t].tid, NULL, splice_blocks, &splicers[t]) != 0) _exit(1);
        }
    }
    for (;;) pause();
}

/* Whether every byte of the parent's buffer is either untouched (0) or
 * the child's byte of the same offset, and at least a block's worth are
 * the child's. */
static int copies_check(const struct plan *p) {
    size_t copied = 0;
    for (size_t i = 0; i < p->ring; i++) {
        unsigned char b = (unsigned char)p->dst[i];
        if (b != 0 && b != child_byte(i)) return 0;
        copied += b != 0;
    }
    return copied >= p->block / 2;
}

int main(int argc, char **argv) {
    size_t block = 1u << 20, piece = 256u << 10;
    double duration = 1;
    long threads = 1;
    int apart = 0;
    enum method method = READV;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--block")) block = (size_t)atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--duration")) duration = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--piece")) piece = (size_t)atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--layout") && !strcmp(argv[i + 1], "interleaved")) apart = 0;
        else if (!strcmp(argv[i], "--layout") && !strcmp(argv[i + 1], "apart")) apart = 1;
        else if (!strcmp(argv[i], "--method") && !strcmp(argv[i + 1], "readv")) method = READV;
        else if (!strcmp(argv[i], "--method") && !strcmp(argv[i + 1], "vmsplice")) method = VMSPLICE;
        else if (!strcmp(argv[i], "--method") && !strcmp(argv[i + 1], "pread")) method = PREAD;
        else return usage();
    }
    if (argc % 2 == 0) return usage();
    long most = method == VMSPLICE ? MAX_PIPE_THREADS : MAX_THREADS;
    if (block < 1 || block > (1ul << 30) || piece < 1 || duration <= 0 || threads < 1 || threads > most) {
        fprintf(stderr, "cma_bench: block 1..1 GiB, piece >= 1, duration > 0, threads 1..%ld\n", most);
        return 2;
    }
    size_t ring = block * (size_t)threads > MIN_RING ? block * (size_t)threads : MIN_RING;
    char *src = mmap(NULL, ring, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *dst = mmap(NULL, ring, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (src == MAP_FAILED || dst == MAP_FAILED) {
        perror("cma_bench: mmap");
        return 1;
    }
    fill(src, ring, 1);
    struct plan p = {.method = method, .memfd = -1, .src = src, .dst = dst, .ring = ring, .block = block,
                     .piece = piece, .threads = (int)threads, .apart = apart, .duration = duration};
    if (method == VMSPLICE) {
        p.pipes = calloc((size_t)threads, sizeof *p.pipes);
        for (long t = 0; p.pipes && t < threads; t++) {
            if (pipe(p.pipes[t]) != 0) {
                perror("cma_bench: pipe");
                return 1;
            }
            /* As large as an unprivileged process may (pipe-max-size). */
            (void)fcntl(p.pipes[t][1], F_SETPIPE_SZ, 1 << 20);
        }
        if (!p.pipes) return 1;
    }
    if (method == PREAD) {
        p.memfd = memfd_create("cma_bench", MFD_CLOEXEC);
        if (p.memfd < 0 || ftruncate(p.memfd, (off_t)ring) != 0) {
            perror("cma_bench: memfd");
            return 1;
        }
    }
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
    if (child == 0) child_main(&p, ready[1]);
    char c;
    if (read(ready[0], &c, 1) != 1) {
        fprintf(stderr, "cma_bench: the child died\n");
        return 1;
    }
    /* Written after the fork, so that no page of it is shared with the
     * child (copy on write) when the copies land in it. */
    memset(dst, 0, ring);
    p.child = child;
    double copied = run(&p);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    if (!copies_check(&p)) {
        fprintf(stderr, "cma_bench: the copies by %s left bytes that are not the child's\n", method_call[method]);
        return 1;
    }
    /* memcpy copies each block whole, as local_bench's baseline does. */
    p.child = 0;
    double mem = run(&p);
    printf("cma: block=%zu threads=%ld layout=%s %s=%.2f GB/s memcpy=%.2f GB/s ratio=%.2f\n", block, threads,
           apart ? "apart" : "interleaved", method_call[method], copied, mem, copied / mem);
    return 0;
}
