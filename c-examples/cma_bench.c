/*
 * cma_bench: how fast one thread copies another process's memory with
 * cross-memory attach (process_vm_readv), beside memcpy of the same blocks
 * in the same run: the ceiling of the shared-memory transport for caller
 * memory (malloc'd or mmap'd buffers, which no other process can map),
 * whose bytes the kernel copies this way in calls of at most 256 KiB
 * (several small requests in one call).
 *
 * The parent forks a child that holds a 256 MiB source buffer (touched,
 * so every page exists) and waits; the parent copies --block bytes at a
 * time from consecutive offsets of it (wrapping) into its own 256 MiB
 * destination, for --duration seconds with process_vm_readv, then the
 * same with memcpy (whole blocks) from its own copy of the source.
 * Prints one line:
 *
 *   cma: block=1048576 process_vm_readv=3.71 GB/s memcpy=8.52 GB/s ratio=0.44
 *
 * GB/s is 1e9 bytes per second. Usage:
 *   cma_bench [--block BYTES] [--duration S] [--piece BYTES]
 */
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

#define RING (256u << 20)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* GB/s of copying `block` bytes at a time for `duration` s: from the
 * child's `src` with process_vm_readv if `child` > 0, in calls of at most
 * `piece` bytes (several blocks per call when they fit, up to IOV_MAX, as
 * the transport groups small requests), else with memcpy of each block
 * from our own `src`. */
static double run(pid_t child, char *src, char *dst, size_t block, size_t piece, double duration) {
    enum { MAX_IOV = 1024 };
    struct iovec local[MAX_IOV], remote[MAX_IOV];
    size_t per_call = block >= piece ? 1 : piece / block;
    if (per_call > MAX_IOV) per_call = MAX_IOV;
    size_t off = 0;
    uint64_t bytes = 0;
    double t0 = now(), t;
    do {
        for (int i = 0; i < 16; i++) {
            if (child <= 0) {
                memcpy(dst + off, src + off, block);
                bytes += block;
                off = (off + block) % (RING - block + 1);
                continue;
            }
            if (per_call == 1) {
                for (size_t p = 0; p < block; p += piece) {
                    size_t n = block - p < piece ? block - p : piece;
                    local[0] = (struct iovec){dst + off + p, n};
                    remote[0] = (struct iovec){src + off + p, n};
                    if (process_vm_readv(child, local, 1, remote, 1, 0) != (ssize_t)n) {
                        perror("cma_bench: process_vm_readv");
                        exit(1);
                    }
                }
                bytes += block;
                off = (off + block) % (RING - block + 1);
                continue;
            }
            for (size_t k = 0; k < per_call; k++) {
                local[k] = (struct iovec){dst + off, block};
                remote[k] = (struct iovec){src + off, block};
                off = (off + block) % (RING - block + 1);
            }
            ssize_t want = (ssize_t)(per_call * block);
            if (process_vm_readv(child, local, per_call, remote, per_call, 0) != want) {
                perror("cma_bench: process_vm_readv");
                exit(1);
            }
            bytes += (uint64_t)want;
        }
        t = now() - t0;
    } while (t < duration);
    return (double)bytes / t / 1e9;
}

int main(int argc, char **argv) {
    size_t block = 1u << 20, piece = 256u << 10;
    double duration = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--block")) block = (size_t)atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--duration")) duration = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--piece")) piece = (size_t)atol(argv[i + 1]);
        else {
            fprintf(stderr, "usage: cma_bench [--block BYTES] [--duration S] [--piece BYTES]\n");
            return 2;
        }
    }
    if (block < 1 || block > RING || piece < 1 || duration <= 0) {
        fprintf(stderr, "cma_bench: block 1..256 MiB, piece >= 1, duration > 0\n");
        return 2;
    }
    char *src = mmap(NULL, RING, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *dst = mmap(NULL, RING, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (src == MAP_FAILED || dst == MAP_FAILED) {
        perror("cma_bench: mmap");
        return 1;
    }
    memset(src, 0x5a, RING);
    memset(dst, 0, RING);
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
        memset(src, 0xa5, RING);
        if (write(ready[1], "", 1) != 1) _exit(1);
        for (;;) pause();
    }
    char c;
    if (read(ready[0], &c, 1) != 1) {
        fprintf(stderr, "cma_bench: the child died\n");
        return 1;
    }
    /* One pass over the whole ring first, so that every page is in
     * memory and mapped on both sides before the timing. */
    run(child, src, dst, RING / 4, piece, 0);
    double cma = run(child, src, dst, block, piece, duration);
    /* memcpy copies each block whole, as local_bench's baseline does. */
    double mem = run(0, src, dst, block, piece, duration);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    printf("cma: block=%zu process_vm_readv=%.2f GB/s memcpy=%.2f GB/s ratio=%.2f\n", block, cma, mem,
           cma / mem);
    return 0;
}
