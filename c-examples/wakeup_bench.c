/*
 * wakeup_bench: the most requests per second one poster can get served by
 * N sleeping processes on this host when every request must wake its
 * server, measured the way the shared-memory transport wakes a target:
 * the poster stores a request number in memory shared with the server and
 * writes the server's eventfd; the server, asleep in epoll_wait on it,
 * reads the eventfd, copies --block bytes, and counts the request done in
 * shared memory; the poster polls those counts (as a caller polls
 * getTransferStatus). Each round posts one request to each of the N
 * servers, then waits for all N.
 *
 * It is the anchor of scripts/bench-fanout.sh: with many target processes
 * on few CPUs no target can keep polling, so each small request costs one
 * such wakeup, and no transport that wakes its target can serve more
 * requests per second than this. Prints one line:
 *
 *   wakeup floor: processes=64 block=4096 requests=75123/s
 *
 * Usage: wakeup_bench [--processes N] [--duration S] [--block BYTES]
 */
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* One server's words, a cache line each so servers do not share one. */
struct slot {
    _Atomic uint64_t posted;
    _Atomic uint64_t done;
    char pad[48];
};

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Serves slot `s` until killed: sleep on the eventfd, copy, count. */
static void serve(struct slot *s, int bell, size_t block) {
    char *src = malloc(block), *dst = malloc(block);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN};
    if (!src || !dst || ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, bell, &ev) != 0) {
        perror("wakeup_bench: server setup");
        _exit(1);
    }
    memset(src, 0x5a, block);
    uint64_t seen = 0;
    for (;;) {
        struct epoll_event got;
        if (epoll_wait(ep, &got, 1, -1) < 0 && errno != EINTR) _exit(1);
        uint64_t rung;
        if (read(bell, &rung, sizeof rung) < 0 && errno != EAGAIN) _exit(1);
        uint64_t posted = atomic_load(&s->posted);
        for (; seen < posted; seen++) {
            memcpy(dst, src, block);
            __asm__ volatile("" : : "r"(dst) : "memory"); /* keep the copy */
            atomic_fetch_add(&s->done, 1);
        }
    }
}

int main(int argc, char **argv) {
    int n = 64;
    double duration = 2;
    size_t block = 4096;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--processes")) n = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--duration")) duration = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--block")) block = (size_t)atol(argv[i + 1]);
        else {
            fprintf(stderr, "usage: wakeup_bench [--processes N] [--duration S] [--block BYTES]\n");
            return 2;
        }
    }
    if (n < 1 || n > 4096 || duration <= 0 || block < 1 || block > (64u << 20)) {
        fprintf(stderr, "wakeup_bench: processes 1..4096, duration > 0, block 1..64 MiB\n");
        return 2;
    }
    struct slot *slots = mmap(NULL, sizeof(struct slot) * (size_t)n, PROT_READ | PROT_WRITE,
                              MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    int *bells = calloc((size_t)n, sizeof(int));
    pid_t *pids = calloc((size_t)n, sizeof(pid_t));
    if (slots == MAP_FAILED || !bells || !pids) {
        perror("wakeup_bench");
        return 1;
    }
    for (int i = 0; i < n; i++) {
        bells[i] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (bells[i] < 0) {
            perror("wakeup_bench: eventfd");
            return 1;
        }
    }
    for (int i = 0; i < n; i++) {
        pids[i] = fork();
        if (pids[i] < 0) {
            perror("wakeup_bench: fork");
            return 1;
        }
        if (pids[i] == 0) serve(&slots[i], bells[i], block);
    }
    /* One warm-up round, then rounds until the time is up. */
    uint64_t round = 0, requests = 0;
    double start = 0;
    for (;;) {
        round++;
        for (int i = 0; i < n; i++) {
            atomic_store(&slots[i].posted, round);
            uint64_t one = 1;
            if (write(bells[i], &one, sizeof one) != sizeof one) {
                perror("wakeup_bench: write");
                return 1;
            }
        }
        for (int i = 0; i < n; i++)
            while (atomic_load(&slots[i].done) != round) {
            }
        if (round == 1) {
            start = now();
            continue;
        }
        requests += (uint64_t)n;
        if (now() - start >= duration) break;
    }
    double rate = (double)requests / (now() - start);
    for (int i = 0; i < n; i++) kill(pids[i], SIGKILL);
    for (int i = 0; i < n; i++) waitpid(pids[i], NULL, 0);
    printf("wakeup floor: processes=%d block=%zu requests=%.0f/s\n", n, block, rate);
    return 0;
}
