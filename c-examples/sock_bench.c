/*
 * sock_bench: loopback TCP between two processes with plain sockets, the
 * way iperf3 moves bytes but with the working set of an engine: each
 * stream's sender sends --block bytes at a time from its own
 * --working_set bytes (every page written first), wrapping, and its
 * receiver receives into its own --working_set bytes the same way. With a
 * working set larger than the caches, the kernel's two copies per byte
 * read and write memory, as they do for an engine moving KV caches;
 * iperf3's one 128 KiB buffer per stream stays in the caches. This is
 * scripts/bench-tcp.sh's anchor at the engine's working set: the kernel's
 * socket path with nothing of ours in it.
 *
 * The parent listens on --streams ports of 127.0.0.1 and forks a child
 * whose --streams threads connect and send for --duration seconds; the
 * parent's threads receive until the end of their stream. With
 * --zerocopy, the senders use MSG_ZEROCOPY (SO_ZEROCOPY), reap the
 * kernel's completions from the error queue (at most 64 sends in flight
 * per stream) and count those the kernel marked as copied: on loopback
 * the kernel copies the pages when it delivers them to the receiving
 * socket. Prints one line:
 *
 *   sock: streams=4 block=1048576 working_set=134217728 zerocopy=0 5.43 GB/s
 *
 * (with --zerocopy, then: sends=N completions=N copied=N). GB/s is 1e9
 * bytes per second received, summed over the streams. Every wait is
 * bounded: a stream that moves nothing for 10 s fails the run. Usage:
 *   sock_bench [--streams N] [--block BYTES] [--working_set BYTES]
 *              [--duration SECONDS] [--zerocopy]
 */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/errqueue.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif
#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000
#endif

#define MAX_STREAMS 64
/* Zero-copy sends a stream may have in flight before it waits for their
 * completions (each holds its pages pinned and counts against optmem). */
#define MAX_IN_FLIGHT 64
/* How long a stream may move nothing before the run fails. */
#define STALL_MS 10000

static struct {
  int streams, zerocopy;
  size_t block, working_set;
  double duration;
} opt = {4, 0, 1 << 20, 128u << 20, 3};

static int listeners[MAX_STREAMS];
/* The sending process's zero-copy counts, to the parent. */
static int counts_pipe[2];
static uint16_t ports[MAX_STREAMS];

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void die(const char *what) {
  fprintf(stderr, "sock_bench: %s: %s\n", what, strerror(errno));
  exit(1);
}

static void usage(const char *why) {
  fprintf(stderr,
          "sock_bench: %s\nusage: sock_bench [--streams N] [--block BYTES] "
          "[--working_set BYTES] [--duration S] [--zerocopy]\n",
          why);
  exit(2);
}

/* A working set with every page written (so no page faults are timed). */
static char *working_set(int fill) {
  char *p = mmap(NULL, opt.working_set, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) die("mmap");
  memset(p, fill, opt.working_set);
  return p;
}

/* Waits up to STALL_MS for `events` on fd; fails the run if none come. */
static void await(int fd, short events) {
  struct pollfd p = {.fd = fd, .events = events};
  int n;
  while ((n = poll(&p, 1, STALL_MS)) < 0 && errno == EINTR) {
  }
  if (n < 0) die("poll");
  if (n == 0) {
    fprintf(stderr, "sock_bench: a stream moved nothing for %d ms\n", STALL_MS);
    exit(1);
  }
}

struct sender {
  int index;
  uint64_t sends, completions, copied;
};

/* Takes the zero-copy completions queued on fd; waits for one with `block`. */
static void reap(int fd, struct sender *s, int block) {
  for (;;) {
    char control[256];
    struct msghdr m = {.msg_control = control, .msg_controllen = sizeof control};
    if (recvmsg(fd, &m, MSG_ERRQUEUE) < 0) {
      if (errno == EAGAIN && block) {
        await(fd, 0); /* POLLERR is always reported */
        continue;
      }
      if (errno == EAGAIN || errno == EINTR) return;
      die("recvmsg(MSG_ERRQUEUE)");
    }
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
      struct sock_extended_err *e = (struct sock_extended_err *)CMSG_DATA(c);
      if (e->ee_errno != 0 || e->ee_origin != SO_EE_ORIGIN_ZEROCOPY) continue;
      uint64_t n = (uint64_t)(e->ee_data - e->ee_info) + 1;
      s->completions += n;
      if (e->ee_code & SO_EE_CODE_ZEROCOPY_COPIED) s->copied += n;
    }
    block = 0;
  }
}

static void *send_stream(void *arg) {
  struct sender *s = arg;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) die("socket");
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(ports[s->index])};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) die("connect");
  int one = 1;
  if (opt.zerocopy && setsockopt(fd, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof one) != 0)
    die("setsockopt(SO_ZEROCOPY)");
  char *buf = working_set(0x5a);
  size_t off = 0;
  double end = now() + opt.duration;
  while (now() < end) {
    size_t left = opt.block;
    char *p = buf + off;
    while (left > 0) {
      await(fd, POLLOUT);
      ssize_t n = send(fd, p, left, MSG_DONTWAIT | (opt.zerocopy ? MSG_ZEROCOPY : 0));
      if (n < 0) {
        if (errno == ENOBUFS && opt.zerocopy) {
          reap(fd, s, 1);
          continue;
        }
        if (errno == EAGAIN || errno == EINTR) continue;
        die("send");
      }
      if (opt.zerocopy) s->sends++;
      p += n;
      left -= (size_t)n;
    }
    if (opt.zerocopy) {
      reap(fd, s, 0);
      while (s->sends - s->completions > MAX_IN_FLIGHT) reap(fd, s, 1);
    }
    off = (off + opt.block) % opt.working_set;
  }
  shutdown(fd, SHUT_WR);
  /* The pages stay pinned until their completions come. */
  while (opt.zerocopy && s->completions < s->sends) reap(fd, s, 1);
  close(fd);
  return NULL;
}

struct receiver {
  int index;
  double gbps;
};

static void *receive_stream(void *arg) {
  struct receiver *r = arg;
  await(listeners[r->index], POLLIN);
  int fd = accept(listeners[r->index], NULL, NULL);
  if (fd < 0) die("accept");
  char *buf = working_set(0);
  size_t off = 0, got = 0;
  double start = now();
  for (;;) {
    await(fd, POLLIN);
    size_t room = opt.block - off % opt.block;
    ssize_t n = recv(fd, buf + off, room, MSG_DONTWAIT);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      die("recv");
    }
    got += (size_t)n;
    off = (off + (size_t)n) % opt.working_set;
  }
  r->gbps = (double)got / (now() - start) / 1e9;
  close(fd);
  return NULL;
}

static size_t parse_size(const char *flag, const char *v) {
  char *end;
  errno = 0;
  unsigned long long n = strtoull(v, &end, 10);
  if (errno || *end || n == 0) {
    fprintf(stderr, "sock_bench: %s needs a positive number, not '%s'\n", flag, v);
    exit(2);
  }
  return (size_t)n;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (!strcmp(f, "--zerocopy")) {
      opt.zerocopy = 1;
      continue;
    }
    if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
      printf("usage: sock_bench [--streams N] [--block BYTES] [--working_set BYTES] "
             "[--duration S] [--zerocopy]\n");
      return 0;
    }
    if (i + 1 >= argc) usage("a flag needs a value");
    const char *v = argv[++i];
    if (!strcmp(f, "--streams")) opt.streams = (int)parse_size(f, v);
    else if (!strcmp(f, "--block")) opt.block = parse_size(f, v);
    else if (!strcmp(f, "--working_set")) opt.working_set = parse_size(f, v);
    else if (!strcmp(f, "--duration")) opt.duration = (double)parse_size(f, v);
    else usage("unknown flag");
  }
  if (opt.streams > MAX_STREAMS) usage("--streams is at most 64");
  if (opt.working_set < opt.block || opt.working_set % opt.block)
    usage("--working_set must be a multiple of --block");

  for (int i = 0; i < opt.streams; i++) {
    int one = 1;
    listeners[i] = socket(AF_INET, SOCK_STREAM, 0);
    if (listeners[i] < 0) die("socket");
    setsockopt(listeners[i], SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (bind(listeners[i], (struct sockaddr *)&a, sizeof a) != 0 || listen(listeners[i], 1) != 0 ||
        getsockname(listeners[i], (struct sockaddr *)&a, &len) != 0)
      die("listen");
    ports[i] = ntohs(a.sin_port);
  }
  if (pipe(counts_pipe) != 0) die("pipe");
  pid_t child = fork();
  if (child < 0) die("fork");
  if (child == 0) {
    pthread_t t[MAX_STREAMS];
    struct sender s[MAX_STREAMS] = {0};
    for (int i = 0; i < opt.streams; i++) {
      s[i].index = i;
      if (pthread_create(&t[i], NULL, send_stream, &s[i]) != 0) die("pthread_create");
    }
    uint64_t sends = 0, completions = 0, copied = 0;
    for (int i = 0; i < opt.streams; i++) {
      pthread_join(t[i], NULL);
      sends += s[i].sends;
      completions += s[i].completions;
      copied += s[i].copied;
    }
    uint64_t counts[3] = {sends, completions, copied};
    _exit(write(counts_pipe[1], counts, sizeof counts) == (ssize_t)sizeof counts ? 0 : 1);
  }
  pthread_t t[MAX_STREAMS];
  struct receiver r[MAX_STREAMS] = {0};
  for (int i = 0; i < opt.streams; i++) {
    r[i].index = i;
    if (pthread_create(&t[i], NULL, receive_stream, &r[i]) != 0) die("pthread_create");
  }
  double total = 0;
  for (int i = 0; i < opt.streams; i++) {
    pthread_join(t[i], NULL);
    total += r[i].gbps;
  }
  int status;
  uint64_t counts[3];
  if (waitpid(child, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
      read(counts_pipe[0], counts, sizeof counts) != (ssize_t)sizeof counts) {
    fprintf(stderr, "sock_bench: the sending process failed\n");
    return 1;
  }
  printf("sock: streams=%d block=%zu working_set=%zu zerocopy=%d %.2f GB/s", opt.streams,
         opt.block, opt.working_set, opt.zerocopy, total);
  if (opt.zerocopy)
    printf(" sends=%llu completions=%llu copied=%llu", (unsigned long long)counts[0],
           (unsigned long long)counts[1], (unsigned long long)counts[2]);
  printf("\n");
  return 0;
}
