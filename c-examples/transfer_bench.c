/*
 * transfer_bench: a C port of Mooncake's transfer_engine_bench
 * (TE/example/transfer_engine_bench.cpp) through the C API only.
 *
 * Target:    transfer_bench --mode target [--metadata_server P2PHANDSHAKE]
 *                [--local_server_name 127.0.0.1] [--buffer_size BYTES] [--verify]
 *            prints one line, then serves until SIGINT/SIGTERM:
 *              segment <name> base <decimal address> size <bytes>
 * Initiator: transfer_bench --mode initiator --segment_id <name> [--target_base <address>]
 *                [--operation read|write] [--block_size 65536] [--batch_size 128]
 *                [--threads 12] [--duration 10] [--report_unit GB] [--verify]
 *            prints a progress line once a second while it runs:
 *              progress: T.T s, batch count N, throughput R <unit>/s
 *            (R: the throughput since the start), then Mooncake's result line:
 *              Test completed: duration D.DD, batch count N, throughput R <unit>/s
 *
 * Flags are Mooncake's (spec section 8), as "--flag value" or "--flag=value":
 *   --mode initiator|target (initiator)     --operation read|write (read)
 *   --protocol tcp|rdma|shm (tcp; a list such as tcp,shm installs each)
 *                                           --metadata_server (P2PHANDSHAKE;
 *       "http://host:port/path" for our metadata server; Mooncake's default is etcd)
 *   --local_server_name (127.0.0.1)         --segment_id (the target's name)
 *   --buffer_size (1 GiB; the initiator raises it to block*batch*threads)
 *   --block_size (65536)  --batch_size (128)  --threads (12)  --duration (10 s)
 *   --report_unit GB|GiB|Gb|MB|MiB|Mb|KB|KiB|Kb (GB; GB = 1e9 bytes, Gb = 1e9 bits)
 *   --report_precision (2)                  --auto_discovery (false)
 * Our additions:
 *   --target_base ADDR   the target's buffer address (from its "segment"
 *                        line). Default: the first buffer of the target
 *                        segment, as Mooncake's bench does, found with
 *                        te_segment_buffers (transfer_engine_ext.h).
 *   --target_size BYTES  the target's buffer size (default: the length of
 *                        that first buffer with the default --target_base,
 *                        else the initiator's buffer size); request offsets
 *                        wrap inside both.
 *   --verify             the target fills its buffer with a known pattern.
 *                        READ: after the timed loop the initiator checks every
 *                        byte of the last batch each thread read. WRITE: the
 *                        initiator writes a known pattern, then reads every
 *                        block back and checks it. A mismatch exits 1.
 *   --verify_seed N      the pattern: what the target fills its buffer with,
 *                        what READ expects, what WRITE writes. Default: 0x5eed
 *                        for target and READ, 0x77 for WRITE (so a WRITE is
 *                        seen to change the target). A WRITE run and a later
 *                        READ run with the same seed and request layout check
 *                        end to end that the READ gets what the WRITE put.
 *   --device_name a,b    Mooncake's flag: the devices (RDMA devices, or for
 *                        tcp network interfaces) to use, as the matrix
 *                        {"cpu:0": [["a","b"],[]]} given to installTransport.
 *   --nic_priority_matrix FILE
 *                        Mooncake's flag: a priority-matrix JSON file given
 *                        to installTransport (wins over --device_name).
 *                        With either, the initiator samples getNicLoadStats
 *                        every --rail_sample_ms (100) during the timed loop
 *                        and prints, after the result line, one line per
 *                        device and the total:
 *                          rail <device>: throughput R <unit>/s (mean EWMA over N samples)
 *                          rail total: throughput R <unit>/s
 *   --rail_stats         print the rail lines without --device_name/matrix.
 *   --targets_file FILE  several targets: one per line, either the target's
 *                        own line ("segment <name> base <addr> size <bytes>")
 *                        or a bare segment name (its first buffer is used).
 *                        Replaces --segment_id; each batch is spread over
 *                        the targets (request i of thread t goes to target
 *                        (i + t) mod count), and offsets wrap inside the
 *                        smallest target buffer.
 *   Every initiator run also prints, after the result line:
 *                          requests: R/s, latency p50 X us, p99 Y us, max Z us (N samples)
 *                          initiator: rss M MiB (peak P MiB), fds F, targets T
 *                        (a request's latency: from its submitTransfer to
 *                        the getTransferStatus that saw it end; memory and
 *                        descriptors of this process at the end of the run)
 *   --engine_buffers     allocate the buffer with te_allocate_buffer (memory
 *                        the engine moves fastest: with shm installed, a
 *                        memfd that peers on this host map) instead of mmap;
 *                        mmap when the engine has none.
 *   --hugepages          ask the kernel to back the mmap'd buffer with
 *                        transparent huge pages (madvise MADV_HUGEPAGE
 *                        before the buffer is first touched), as a caller
 *                        whose memory sits in 2 MiB pages: cross-memory
 *                        attach then walks one page-table entry per 2 MiB
 *                        instead of one per 4 KiB. Takes effect where
 *                        /sys/kernel/mm/transparent_hugepage/enabled is
 *                        "madvise" or "always"; no effect on
 *                        --engine_buffers.
 *   --wait_batch         wait for each batch with te_wait_batch (which polls
 *                        and yields for the first millisecond, then parks
 *                        until a task ends, as the Python package's calls
 *                        wait) instead of polling each task with
 *                        getTransferStatus and yielding (Mooncake's bench
 *                        spins); a request's latency then runs to the
 *                        return of the wait that saw its batch end.
 * Mooncake flags without meaning here (--backend, GPU flags) are accepted
 * and ignored with a note on stderr.
 *
 * Each initiator thread t loops until --duration ends: allocate a batch,
 * batch_size requests of block_size at offset block*(i*threads+t) (the same
 * offset locally and in the target buffer), submit, poll every task until
 * it is terminal, free the batch. A FAILED task stops the run: exit 1.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "transfer_engine_ext.h"

#define MAX_THREADS 1024
#define VERIFY_SEED_TARGET 0x5eedu
#define VERIFY_SEED_WRITE 0x77u

struct options {
  const char *mode, *operation, *protocol, *metadata_server, *local_server_name, *segment_id;
  const char *targets_file;
  const char *report_unit;
  const char *device_name, *nic_priority_matrix;
  uint64_t rail_sample_ms, handshakes;
  int rail_stats;
  int engine_buffers;
  int hugepages;
  int wait_batch;
  uint64_t buffer_size, block_size, batch_size, target_base, target_size, verify_seed;
  int threads, report_precision, auto_discovery, verify;
  double duration;
};

static struct options opt = {
    .mode = "initiator",
    .operation = "read",
    .protocol = "tcp",
    .metadata_server = "P2PHANDSHAKE",
    .local_server_name = "127.0.0.1",
    .segment_id = NULL,
    .report_unit = "GB",
    .buffer_size = 1ull << 30,
    .block_size = 65536,
    .batch_size = 128,
    .threads = 12,
    .report_precision = 2,
    .duration = 10,
    .rail_sample_ms = 100,
};

static volatile sig_atomic_t stop_signal;
static atomic_int running = 1;

static void on_signal(int sig) { stop_signal = sig; }

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The byte at offset `i` of a buffer filled with pattern `seed`: cheap to
 * compute, different per seed, with a period (251) no block size lines up with. */
static inline unsigned char pattern(uint64_t seed, uint64_t i) {
  return (unsigned char)((i % 251) ^ (seed * 0x9e3779b97f4a7c15ull >> 56) ^ (i >> 12));
}

static void fill(unsigned char *p, uint64_t off, uint64_t n, uint64_t seed) {
  for (uint64_t i = 0; i < n; i++) p[i] = pattern(seed, off + i);
}

/* Number of bytes of p[0..n) that differ from the pattern at offset off;
 * *first gets the index of the first one. */
static uint64_t mismatches(const unsigned char *p, uint64_t off, uint64_t n, uint64_t seed,
                           uint64_t *first) {
  uint64_t bad = 0;
  for (uint64_t i = 0; i < n; i++)
    if (p[i] != pattern(seed, off + i)) {
      if (!bad) *first = i;
      bad++;
    }
  return bad;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static const char *last_error(void);

/* --handshakes N: N descriptor fetches from the target (openSegmentNoCache:
 * each one connection to its handshake listener, with authentication when
 * a cluster key is set, and a Metadata request); prints the median and the
 * 90th percentile in microseconds. */
static int time_handshakes(transfer_engine_t e) {
  double *t = calloc(opt.handshakes, sizeof *t);
  if (!t) return 1;
  for (uint64_t i = 0; i < opt.handshakes; i++) {
    double t0 = now();
    if (openSegmentNoCache(e, opt.segment_id) < 0) {
      fprintf(stderr, "transfer_bench: openSegmentNoCache(%s) failed: %s\n", opt.segment_id,
              last_error());
      free(t);
      return 1;
    }
    t[i] = (now() - t0) * 1e6;
  }
  qsort(t, opt.handshakes, sizeof *t, cmp_double);
  printf("handshakes %" PRIu64 " median_us %.1f p90_us %.1f\n", opt.handshakes,
         t[opt.handshakes / 2], t[opt.handshakes * 9 / 10]);
  free(t);
  return 0;
}

/* ------------------------------------------------------------ arguments */

static void usage(const char *why) {
  if (why) fprintf(stderr, "transfer_bench: %s\n", why);
  fprintf(stderr,
          "usage: transfer_bench --mode target|initiator [--metadata_server P2PHANDSHAKE|http://...]\n"
          "         [--local_server_name HOST] [--protocol tcp|rdma|shm[,...]] [--buffer_size BYTES] [--verify]\n"
          "       initiator: --segment_id NAME [--target_base ADDR] [--target_size BYTES]\n"
          "         [--operation read|write] [--block_size B] [--batch_size N] [--threads N]\n"
          "         [--duration S] [--report_unit GB|GiB|Gb|MB|MiB|Mb|KB|KiB|Kb]\n"
          "         [--report_precision N] [--auto_discovery] [--rail_stats]\n"
          "         [--engine_buffers] [--hugepages] [--wait_batch]\n"
          "         [--handshakes N: time N handshakes (openSegmentNoCache), print, exit]\n"
          "       both: [--device_name IF1,IF2 | --nic_priority_matrix FILE]\n");
  exit(2);
}

static uint64_t parse_u64(const char *flag, const char *v) {
  char *end;
  errno = 0;
  unsigned long long x = strtoull(v, &end, 0);
  if (errno || end == v || *end || v[0] == '-') {
    char msg[256];
    snprintf(msg, sizeof msg, "%s: '%s' is not a non-negative integer", flag, v);
    usage(msg);
  }
  return (uint64_t)x;
}

static int parse_bool(const char *flag, const char *v) {
  if (!strcmp(v, "true") || !strcmp(v, "1") || !strcmp(v, "yes")) return 1;
  if (!strcmp(v, "false") || !strcmp(v, "0") || !strcmp(v, "no")) return 0;
  char msg[256];
  snprintf(msg, sizeof msg, "%s: '%s' is not true or false", flag, v);
  usage(msg);
  return 0;
}

static int is_bool_word(const char *v) {
  return v && (!strcmp(v, "true") || !strcmp(v, "false") || !strcmp(v, "1") || !strcmp(v, "0"));
}

static void parse_args(int argc, char **argv) {
  static const char *ignored[] = {"--backend", "--use_vram", "--init_mem", "--gpu_id", NULL};
  for (int i = 1; i < argc; i++) {
    char flagbuf[128];
    const char *arg = argv[i], *value = NULL;
    if (strncmp(arg, "--", 2) != 0) {
      char msg[256];
      snprintf(msg, sizeof msg, "unexpected argument '%s'", arg);
      usage(msg);
    }
    const char *eq = strchr(arg, '=');
    if (eq) {
      size_t n = (size_t)(eq - arg);
      if (n >= sizeof flagbuf) usage("flag name too long");
      memcpy(flagbuf, arg, n);
      flagbuf[n] = 0;
      value = eq + 1;
    } else {
      snprintf(flagbuf, sizeof flagbuf, "%s", arg);
    }
    const char *flag = flagbuf;
    if (!strcmp(flag, "--help") || !strcmp(flag, "-h")) usage(NULL);

    /* Booleans: "--flag", "--flag=true", "--flag true", "--noflag". */
    int *boolp = NULL, boolv = 1;
    if (!strcmp(flag, "--verify")) boolp = &opt.verify;
    else if (!strcmp(flag, "--auto_discovery")) boolp = &opt.auto_discovery;
    else if (!strcmp(flag, "--noverify")) boolp = &opt.verify, boolv = 0;
    else if (!strcmp(flag, "--noauto_discovery")) boolp = &opt.auto_discovery, boolv = 0;
    else if (!strcmp(flag, "--rail_stats")) boolp = &opt.rail_stats;
    else if (!strcmp(flag, "--engine_buffers")) boolp = &opt.engine_buffers;
    else if (!strcmp(flag, "--hugepages")) boolp = &opt.hugepages;
    else if (!strcmp(flag, "--wait_batch")) boolp = &opt.wait_batch;
    if (boolp) {
      if (value) boolv = parse_bool(flag, value);
      else if (i + 1 < argc && is_bool_word(argv[i + 1])) boolv = parse_bool(flag, argv[++i]);
      *boolp = boolv;
      continue;
    }

    if (!value) {
      if (i + 1 >= argc) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s needs a value", flag);
        usage(msg);
      }
      value = argv[++i];
    }
    int known = 1;
    if (!strcmp(flag, "--mode")) opt.mode = value;
    else if (!strcmp(flag, "--operation")) opt.operation = value;
    else if (!strcmp(flag, "--protocol")) opt.protocol = value;
    else if (!strcmp(flag, "--metadata_server")) opt.metadata_server = value;
    else if (!strcmp(flag, "--local_server_name")) opt.local_server_name = value;
    else if (!strcmp(flag, "--segment_id")) opt.segment_id = value;
    else if (!strcmp(flag, "--targets_file")) opt.targets_file = value;
    else if (!strcmp(flag, "--report_unit")) opt.report_unit = value;
    else if (!strcmp(flag, "--device_name")) opt.device_name = value;
    else if (!strcmp(flag, "--nic_priority_matrix")) opt.nic_priority_matrix = value;
    else if (!strcmp(flag, "--rail_sample_ms")) opt.rail_sample_ms = parse_u64(flag, value);
    else if (!strcmp(flag, "--handshakes")) opt.handshakes = parse_u64(flag, value);
    else if (!strcmp(flag, "--buffer_size")) opt.buffer_size = parse_u64(flag, value);
    else if (!strcmp(flag, "--block_size")) opt.block_size = parse_u64(flag, value);
    else if (!strcmp(flag, "--batch_size")) opt.batch_size = parse_u64(flag, value);
    else if (!strcmp(flag, "--target_base")) opt.target_base = parse_u64(flag, value);
    else if (!strcmp(flag, "--target_size")) opt.target_size = parse_u64(flag, value);
    else if (!strcmp(flag, "--verify_seed")) opt.verify_seed = parse_u64(flag, value);
    else if (!strcmp(flag, "--threads")) opt.threads = (int)parse_u64(flag, value);
    else if (!strcmp(flag, "--report_precision")) opt.report_precision = (int)parse_u64(flag, value);
    else if (!strcmp(flag, "--duration")) {
      char *end;
      opt.duration = strtod(value, &end);
      if (end == value || *end || !(opt.duration > 0)) usage("--duration must be a positive number");
    } else {
      known = 0;
      for (int k = 0; ignored[k]; k++)
        if (!strcmp(flag, ignored[k])) {
          fprintf(stderr, "transfer_bench: note: %s has no effect here; ignored\n", flag);
          known = 1;
        }
    }
    if (!known) {
      char msg[256];
      snprintf(msg, sizeof msg, "unknown flag '%s'", flag);
      usage(msg);
    }
  }

  if (strcmp(opt.mode, "initiator") && strcmp(opt.mode, "target"))
    usage("--mode must be initiator or target");
  if (strcmp(opt.operation, "read") && strcmp(opt.operation, "write"))
    usage("--operation must be read or write");
  {
    char list[256];
    snprintf(list, sizeof list, "%s", opt.protocol);
    for (char *save = NULL, *p = strtok_r(list, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
      if (strcmp(p, "tcp") && strcmp(p, "rdma") && strcmp(p, "shm")) {
        fprintf(stderr, "transfer_bench: --protocol %s is not supported; use tcp, rdma or shm\n",
                p);
        exit(2);
      }
    }
  }
  if (opt.block_size == 0 || opt.batch_size == 0) usage("--block_size and --batch_size must be > 0");
  if (opt.threads < 1 || opt.threads > MAX_THREADS) usage("--threads must be 1..1024");
  if (opt.report_precision > 12) usage("--report_precision must be 0..12");
  if (opt.buffer_size == 0) usage("--buffer_size must be > 0");
  if (opt.rail_sample_ms == 0) usage("--rail_sample_ms must be > 0");
  if (opt.device_name || opt.nic_priority_matrix) opt.rail_stats = 1;
}

/* The priority matrix for installTransport: the --nic_priority_matrix file,
 * or {"cpu:0": [[devices of --device_name],[]]}, or NULL (every device). */
static char *matrix_json(void) {
  if (opt.nic_priority_matrix && *opt.nic_priority_matrix) {
    FILE *f = fopen(opt.nic_priority_matrix, "r");
    if (!f) {
      fprintf(stderr, "transfer_bench: cannot open --nic_priority_matrix %s: %s\n",
              opt.nic_priority_matrix, strerror(errno));
      exit(2);
    }
    size_t cap = 4096, n = 0;
    char *s = malloc(cap);
    for (size_t got; s && (got = fread(s + n, 1, cap - n - 1, f)) > 0;) {
      n += got;
      if (cap - n - 1 == 0) s = realloc(s, cap *= 2);
    }
    fclose(f);
    if (!s) exit(1);
    s[n] = 0;
    return s;
  }
  if (!opt.device_name || !*opt.device_name) return NULL;
  size_t len = strlen(opt.device_name);
  char *s = malloc(len * 3 + 32);
  if (!s) exit(1);
  char *o = s + sprintf(s, "{\"cpu:0\": [[");
  const char *p = opt.device_name;
  int first = 1;
  while (*p) {
    size_t k = strcspn(p, ",");
    if (k) {
      o += sprintf(o, "%s\"%.*s\"", first ? "" : ",", (int)k, p);
      first = 0;
    }
    p += k;
    if (*p == ',') p++;
  }
  sprintf(o, "],[]]}");
  return s;
}

static double unit_bytes(const char *u) {
  static const struct { const char *name; double bytes; } units[] = {
      {"GB", 1e9}, {"GiB", 1073741824.0}, {"Gb", 1e9 / 8}, {"MB", 1e6}, {"MiB", 1048576.0},
      {"Mb", 1e6 / 8}, {"KB", 1e3}, {"KiB", 1024.0}, {"Kb", 1e3 / 8}};
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
    if (!strcmp(u, units[i].name)) return units[i].bytes;
  return 0;
}

/* --------------------------------------------------------------- engine */

/* The reason of the last failed call on this thread (te_last_error). */
static const char *last_error(void) {
  static _Thread_local char msg[512];
  if (te_last_error(msg, sizeof msg) == 0) snprintf(msg, sizeof msg, "no error recorded");
  return msg;
}

static transfer_engine_t make_engine(char *name, size_t name_len) {
  transfer_engine_t e =
      createTransferEngine(opt.metadata_server, opt.local_server_name, NULL, 0, opt.auto_discovery);
  if (!e) {
    fprintf(stderr, "transfer_bench: createTransferEngine(%s, %s) failed: %s\n",
            opt.metadata_server, opt.local_server_name, last_error());
    exit(1);
  }
  char *matrix = matrix_json();
  char list[256];
  snprintf(list, sizeof list, "%s", opt.protocol);
  for (char *save = NULL, *p = strtok_r(list, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
    /* The devices are the network transport's. */
    char *m = strcmp(p, "shm") ? matrix : NULL;
    void *installed = installTransport(e, p, m ? (void **)&m : NULL);
    if (!installed) {
      fprintf(stderr, "transfer_bench: installTransport(%s%s%s) failed: %s\n", p, m ? ", " : "",
              m ? m : "", last_error());
      destroyTransferEngine(e);
      exit(1);
    }
  }
  free(matrix);
  /* P2P mode renames the engine "host:<rpc port>"; with a metadata server
   * the name is kept as given. */
  if (!strcmp(opt.metadata_server, "P2PHANDSHAKE")) {
    if (getLocalIpAndPort(e, name, name_len) != 0) {
      fprintf(stderr, "transfer_bench: getLocalIpAndPort failed\n");
      exit(1);
    }
  } else {
    snprintf(name, name_len, "%s", opt.local_server_name);
  }
  return e;
}

/* Whether the buffer came from te_allocate_buffer. */
static int engine_buffer;

static unsigned char *alloc_buffer(transfer_engine_t e, uint64_t size) {
  if (opt.engine_buffers) {
    void *m = te_allocate_buffer(e, size);
    if (m) {
      engine_buffer = 1;
      return m;
    }
    fprintf(stderr, "transfer_bench: te_allocate_buffer: %s; using mmap\n", last_error());
  }
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    fprintf(stderr, "transfer_bench: cannot allocate %" PRIu64 " bytes: %s\n", size, strerror(errno));
    exit(1);
  }
  if (opt.hugepages && madvise(p, size, MADV_HUGEPAGE) != 0)
    fprintf(stderr, "transfer_bench: madvise(MADV_HUGEPAGE): %s; using 4 KiB pages\n", strerror(errno));
  return p;
}

/* The pattern seed of this run (see --verify_seed). */
static uint64_t verify_seed(int write) {
  if (opt.verify_seed) return opt.verify_seed;
  return write ? VERIFY_SEED_WRITE : VERIFY_SEED_TARGET;
}

/* Unregisters and frees the buffer of alloc_buffer, then the engine. */
static void release(transfer_engine_t e, unsigned char *buf) {
  unregisterLocalMemory(e, buf);
  if (engine_buffer) te_free_buffer(e, buf);
  destroyTransferEngine(e);
  if (!engine_buffer) munmap(buf, opt.buffer_size);
}

static int target_main(void) {
  char name[256];
  transfer_engine_t e = make_engine(name, sizeof name);
  unsigned char *buf = alloc_buffer(e, opt.buffer_size);
  if (opt.verify) fill(buf, 0, opt.buffer_size, verify_seed(0));
  else memset(buf, 0, opt.buffer_size); /* fault the pages in before timing */
  int rc = registerLocalMemory(e, buf, opt.buffer_size, "cpu:0", 1);
  if (rc != 0) {
    fprintf(stderr, "transfer_bench: registerLocalMemory(%" PRIu64 " bytes) returned %d: %s\n",
            opt.buffer_size, rc, last_error());
    return 1;
  }
  printf("segment %s base %" PRIu64 " size %" PRIu64 "\n", name, (uint64_t)(uintptr_t)buf,
         opt.buffer_size);
  fflush(stdout);

  while (!stop_signal) {
    int n = 0;
    notify_msg_t *msgs = getNotifsFromEngine(e, &n);
    for (int i = 0; msgs && i < n; i++) printf("notify %s %s\n", msgs[i].name, msgs[i].msg);
    if (msgs) {
      fflush(stdout);
      freeNotifsMsgBuf(msgs, n);
    }
    usleep(100 * 1000);
  }
  fprintf(stderr, "transfer_bench: signal %d, stopping\n", (int)stop_signal);
  release(e, buf);
  return 0;
}

/* One target segment and the buffer requests go to. */
struct target {
  segment_id_t segment;
  uint64_t base, size;
};

/* Latency samples of one thread: every request until the array is full,
 * then a uniform sample of all (reservoir sampling). */
#define MAX_SAMPLES (1u << 18)

struct worker {
  pthread_t tid;
  int index;
  transfer_engine_t engine;
  const struct target *targets;
  size_t ntargets;
  unsigned char *local;
  uint64_t region; /* offsets wrap inside [0, region) on both sides */
  atomic_uint_fast64_t batches;
  int failed;
  double *samples;
  uint64_t seen, rng;
  double slowest;
};

static void record_latency(struct worker *w, double seconds) {
  if (seconds > w->slowest) w->slowest = seconds;
  uint64_t k = w->seen++;
  if (k < MAX_SAMPLES) {
    w->samples[k] = seconds;
    return;
  }
  w->rng = w->rng * 6364136223846793005ull + 1442695040888963407ull;
  uint64_t j = (w->rng >> 16) % (k + 1);
  if (j < MAX_SAMPLES) w->samples[j] = seconds;
}

static uint64_t offset_of(const struct worker *w, uint64_t i) {
  return opt.block_size * (i * (uint64_t)opt.threads + (uint64_t)w->index) % w->region;
}

/* One batch of batch_size requests; returns 0 when every task completed. */
static int run_batch(struct worker *w, struct transfer_request *reqs) {
  batch_id_t b = allocateBatchID(w->engine, opt.batch_size);
  if (b == INVALID_BATCH) {
    fprintf(stderr, "thread %d: allocateBatchID failed: %s\n", w->index, last_error());
    return -1;
  }
  double submitted = now();
  int rc = submitTransfer(w->engine, b, reqs, opt.batch_size);
  if (rc != 0) {
    fprintf(stderr, "thread %d: submitTransfer returned %d: %s\n", w->index, rc, last_error());
    freeBatchID(w->engine, b);
    return -1;
  }
  int result = 0;
  if (opt.wait_batch) {
    /* TE_WAIT_TIMED_OUT: a task still runs after 10 s, or reports TIMEOUT
     * (MC_SLICE_TIMEOUT); wait on, as the poll below does. */
    while ((rc = te_wait_batch(w->engine, b, 10000)) == TE_WAIT_TIMED_OUT) {
    }
    if (rc < 0) {
      fprintf(stderr, "thread %d: te_wait_batch returned %d: %s\n", w->index, rc, last_error());
      return -1;
    }
  }
  for (uint64_t i = 0; i < opt.batch_size; i++) {
    struct transfer_status st;
    for (unsigned spins = 0;; spins++) {
      if (getTransferStatus(w->engine, b, i, &st) != 0) {
        fprintf(stderr, "thread %d: getTransferStatus(task %" PRIu64 ") failed: %s\n", w->index,
                i, last_error());
        return -1;
      }
      if (st.status == STATUS_COMPLETED || st.status == STATUS_FAILED) {
        if (w->samples) record_latency(w, now() - submitted);
        break;
      }
      /* Two cores are shared with the engine's threads (and, on loopback,
       * the target): spin briefly, then yield. */
      if (spins > 64) sched_yield();
    }
    if (st.status == STATUS_FAILED) {
      if (!result)
        fprintf(stderr, "thread %d: task %" PRIu64 " FAILED (offset %" PRIu64 ", %" PRIu64
                " bytes)\n", w->index, i, offset_of(w, i), opt.block_size);
      result = -1;
    }
  }
  rc = freeBatchID(w->engine, b);
  if (rc != 0) {
    fprintf(stderr, "thread %d: freeBatchID returned %d: %s\n", w->index, rc, last_error());
    result = -1;
  }
  return result;
}

static void build_requests(struct worker *w, struct transfer_request *reqs, int opcode) {
  for (uint64_t i = 0; i < opt.batch_size; i++) {
    uint64_t off = offset_of(w, i);
    const struct target *t = &w->targets[(i + (uint64_t)w->index) % w->ntargets];
    reqs[i] = (struct transfer_request){.opcode = opcode,
                                        .source = w->local + off,
                                        .target_id = t->segment,
                                        .target_offset = t->base + off,
                                        .length = opt.block_size};
  }
}

/* Checks every block of thread w's batch against the pattern `seed`. */
static int verify_blocks(struct worker *w, uint64_t seed, const char *what) {
  uint64_t bad_total = 0;
  for (uint64_t i = 0; i < opt.batch_size; i++) {
    uint64_t off = offset_of(w, i), first = 0;
    uint64_t bad = mismatches(w->local + off, off, opt.block_size, seed, &first);
    if (bad && !bad_total)
      fprintf(stderr, "thread %d: %s: block at offset %" PRIu64 ": %" PRIu64
              " bytes differ, first at +%" PRIu64 " (got %u, want %u)\n", w->index, what, off,
              bad, first, w->local[off + first], pattern(seed, off + first));
    bad_total += bad;
  }
  if (bad_total)
    fprintf(stderr, "thread %d: %s: %" PRIu64 " mismatched bytes in total\n", w->index, what,
            bad_total);
  return bad_total ? -1 : 0;
}

static void *worker_main(void *arg) {
  struct worker *w = arg;
  int write = !strcmp(opt.operation, "write");
  struct transfer_request *reqs = calloc(opt.batch_size, sizeof *reqs);
  if (!reqs) {
    w->failed = 1;
    return NULL;
  }
  build_requests(w, reqs, write ? OPCODE_WRITE : OPCODE_READ);
  while (atomic_load_explicit(&running, memory_order_relaxed)) {
    if (run_batch(w, reqs) != 0) {
      w->failed = 1;
      atomic_store(&running, 0);
      break;
    }
    atomic_fetch_add_explicit(&w->batches, 1, memory_order_relaxed);
  }
  free(reqs);
  return NULL;
}

/* ------------------------------------------------- per-rail throughput */

#define MAX_RAILS 64

/* getNicLoadStats sampled during the timed loop: the mean of each device's
 * EWMA bandwidth over the samples. */
struct rail_sampler {
  pthread_t tid;
  transfer_engine_t engine;
  atomic_int stop;
  size_t n;
  char name[MAX_RAILS][64];
  double sum[MAX_RAILS];
  uint64_t samples;
};

static void *sampler_main(void *arg) {
  struct rail_sampler *r = arg;
  nic_load_stat_t stats[MAX_RAILS];
  while (!atomic_load(&r->stop)) {
    usleep((useconds_t)(opt.rail_sample_ms * 1000));
    size_t count = MAX_RAILS;
    if (getNicLoadStats(r->engine, stats, &count) != 0) continue;
    if (count > MAX_RAILS) count = MAX_RAILS;
    for (size_t i = 0; i < count; i++) {
      size_t k = 0;
      while (k < r->n && strcmp(r->name[k], stats[i].device_name)) k++;
      if (k == r->n) {
        if (r->n == MAX_RAILS) continue;
        snprintf(r->name[k], sizeof r->name[k], "%.63s", stats[i].device_name);
        r->n++;
      }
      r->sum[k] += stats[i].ewma_bandwidth_bps;
    }
    r->samples++;
  }
  return NULL;
}

static void print_rails(const struct rail_sampler *r, double unit) {
  double total = 0;
  for (size_t k = 0; k < r->n; k++) {
    double mean = r->samples ? r->sum[k] / (double)r->samples : 0;
    /* The unbound rail of a peer without published devices: only if used. */
    if (!strcmp(r->name[k], "default") && mean == 0) continue;
    total += mean;
    printf("rail %s: throughput %.*f %s/s (mean EWMA over %" PRIu64 " samples)\n", r->name[k],
           opt.report_precision, mean / unit, opt.report_unit, r->samples);
  }
  printf("rail total: throughput %.*f %s/s\n", opt.report_precision, total / unit,
         opt.report_unit);
}

/* After the timed loop: check what the threads moved. */
static int verify_after(struct worker *ws) {
  int write = !strcmp(opt.operation, "write"), bad = 0;
  for (int t = 0; t < opt.threads; t++) {
    struct worker *w = &ws[t];
    if (!write) {
      /* The last batch read each block from the target's pattern. */
      bad |= verify_blocks(w, verify_seed(0), "READ check") != 0;
      continue;
    }
    /* Read back every block the thread wrote, over a scrubbed local copy. */
    for (uint64_t i = 0; i < opt.batch_size; i++)
      memset(w->local + offset_of(w, i), 0xA5, opt.block_size);
    struct transfer_request *reqs = calloc(opt.batch_size, sizeof *reqs);
    if (!reqs) return -1;
    build_requests(w, reqs, OPCODE_READ);
    if (run_batch(w, reqs) != 0) {
      fprintf(stderr, "thread %d: the read-back batch failed\n", t);
      bad = 1;
    } else {
      bad |= verify_blocks(w, verify_seed(1), "WRITE read-back check") != 0;
    }
    free(reqs);
  }
  return bad ? -1 : 0;
}

/* Opens one target: `base`/`size` 0 take its first buffer (and its
 * length), as Mooncake's bench does. */
static int open_target(transfer_engine_t e, const char *name, uint64_t base, uint64_t size,
                       struct target *t) {
  t->segment = openSegment(e, name);
  if (t->segment < 0) {
    fprintf(stderr, "transfer_bench: openSegment(%s) failed: %s (is the target running, and is "
            "--metadata_server the same as the target's?)\n", name, last_error());
    return -1;
  }
  if (!base) {
    te_buffer_info_t first;
    size_t count = 0;
    if (te_segment_buffers(e, t->segment, &first, 1, &count) != 0) {
      fprintf(stderr, "transfer_bench: te_segment_buffers failed: %s\n", last_error());
      return -1;
    }
    if (count == 0) {
      fprintf(stderr, "transfer_bench: segment %s has no registered buffer\n", name);
      return -1;
    }
    base = first.addr;
    if (!size) size = first.length;
  }
  t->base = base;
  t->size = size ? size : opt.buffer_size;
  return 0;
}

/* The targets: --segment_id (with --target_base/--target_size), or each
 * line of --targets_file. NULL after a message on failure. */
static struct target *load_targets(transfer_engine_t e, size_t *n) {
  if (!opt.targets_file) {
    struct target *t = calloc(1, sizeof *t);
    if (!t || open_target(e, opt.segment_id, opt.target_base, opt.target_size, t) != 0) {
      free(t);
      return NULL;
    }
    *n = 1;
    return t;
  }
  FILE *f = fopen(opt.targets_file, "r");
  if (!f) {
    fprintf(stderr, "transfer_bench: %s: %s\n", opt.targets_file, strerror(errno));
    return NULL;
  }
  struct target *ts = NULL;
  size_t count = 0, cap = 0;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    char name[256];
    unsigned long long base = 0, size = 0;
    if (sscanf(line, "segment %255s base %llu size %llu", name, &base, &size) < 1 &&
        sscanf(line, "%255s", name) != 1)
      continue;
    if (count == cap) {
      cap = cap ? 2 * cap : 16;
      struct target *grown = realloc(ts, cap * sizeof *ts);
      if (!grown) break;
      ts = grown;
    }
    if (open_target(e, name, base, size, &ts[count]) != 0) {
      free(ts);
      fclose(f);
      return NULL;
    }
    count++;
  }
  fclose(f);
  if (count == 0) {
    fprintf(stderr, "transfer_bench: %s names no target\n", opt.targets_file);
    free(ts);
    return NULL;
  }
  *n = count;
  return ts;
}

/* The requests' latencies over every thread: median and 99th percentile. */
static void print_latency(struct worker *ws, double requests_per_s) {
  size_t n = 0;
  for (int t = 0; t < opt.threads; t++)
    n += ws[t].seen < MAX_SAMPLES ? ws[t].seen : MAX_SAMPLES;
  double *all = malloc((n ? n : 1) * sizeof *all);
  if (!all) return;
  size_t k = 0;
  double slowest = 0;
  for (int t = 0; t < opt.threads; t++) {
    if (ws[t].slowest > slowest) slowest = ws[t].slowest;
    size_t m = ws[t].seen < MAX_SAMPLES ? ws[t].seen : MAX_SAMPLES;
    memcpy(all + k, ws[t].samples, m * sizeof *all);
    k += m;
  }
  qsort(all, n, sizeof *all, cmp_double);
  printf("requests: %.0f/s, latency p50 %.1f us, p99 %.1f us, max %.1f us (%zu samples)\n",
         requests_per_s, n ? all[n / 2] * 1e6 : 0.0, n ? all[n * 99 / 100] * 1e6 : 0.0,
         slowest * 1e6, n);
  free(all);
}

/* This process's memory (now and at its peak) and open descriptors. */
static void print_footprint(size_t ntargets) {
  double rss = 0, peak = 0;
  FILE *f = fopen("/proc/self/status", "r");
  if (f) {
    char line[256];
    while (fgets(line, sizeof line, f)) {
      unsigned long kib;
      if (sscanf(line, "VmRSS: %lu kB", &kib) == 1) rss = (double)kib / 1024;
      if (sscanf(line, "VmHWM: %lu kB", &kib) == 1) peak = (double)kib / 1024;
    }
    fclose(f);
  }
  int fds = 0;
  DIR *d = opendir("/proc/self/fd");
  if (d) {
    for (struct dirent *de; (de = readdir(d));)
      if (de->d_name[0] != '.') fds++;
    closedir(d);
    fds--; /* the directory's own descriptor */
  }
  printf("initiator: rss %.1f MiB (peak %.1f MiB), fds %d, targets %zu\n", rss, peak, fds,
         ntargets);
}

static int initiator_main(void) {
  double unit = unit_bytes(opt.report_unit);
  if (unit == 0) usage("--report_unit must be one of GB GiB Gb MB MiB Mb KB KiB Kb");
  if (!opt.segment_id && !opt.targets_file)
    usage("--segment_id (the target's name, from its 'segment' line) or --targets_file is required");
  uint64_t need = opt.block_size * opt.batch_size * (uint64_t)opt.threads;
  if (opt.buffer_size < need) opt.buffer_size = need; /* as Mooncake does */

  char name[256];
  transfer_engine_t e = make_engine(name, sizeof name);
  unsigned char *buf = alloc_buffer(e, opt.buffer_size);
  int write = !strcmp(opt.operation, "write");
  if (opt.verify && write) fill(buf, 0, opt.buffer_size, verify_seed(1));
  else memset(buf, 0x3c, opt.buffer_size);
  int rc = registerLocalMemory(e, buf, opt.buffer_size, "cpu:0", 1);
  if (rc != 0) {
    fprintf(stderr, "transfer_bench: registerLocalMemory returned %d: %s\n", rc, last_error());
    return 1;
  }
  size_t ntargets = 0;
  struct target *targets = load_targets(e, &ntargets);
  if (!targets) return 1;
  if (opt.handshakes) return time_handshakes(e);
  uint64_t region = opt.buffer_size;
  for (size_t k = 0; k < ntargets; k++)
    if (targets[k].size < region) region = targets[k].size;
  region -= region % opt.block_size;
  if (region == 0) usage("--target_size is smaller than one block");

  struct worker *ws = calloc((size_t)opt.threads, sizeof *ws);
  if (!ws) return 1;
  struct rail_sampler *rails = NULL;
  if (opt.rail_stats) {
    rails = calloc(1, sizeof *rails);
    if (!rails) return 1;
    rails->engine = e;
    if (pthread_create(&rails->tid, NULL, sampler_main, rails) != 0) {
      fprintf(stderr, "transfer_bench: pthread_create failed\n");
      return 1;
    }
  }
  double t0 = now();
  for (int t = 0; t < opt.threads; t++) {
    ws[t] = (struct worker){.index = t, .engine = e, .targets = targets, .ntargets = ntargets,
                            .local = buf, .region = region, .rng = (uint64_t)t + 1,
                            .samples = malloc(MAX_SAMPLES * sizeof(double))};
    if (pthread_create(&ws[t].tid, NULL, worker_main, &ws[t]) != 0) {
      fprintf(stderr, "transfer_bench: pthread_create failed\n");
      return 1;
    }
  }
  /* Sleep for the duration, waking early on a failure or a signal, with a
   * progress line once a second. */
  double bytes_per_batch = (double)opt.batch_size * (double)opt.block_size;
  double next_report = t0 + 1;
  while (atomic_load(&running) && !stop_signal && now() - t0 < opt.duration) {
    double left = opt.duration - (now() - t0);
    usleep(left > 0.05 ? 50000 : (useconds_t)(left * 1e6) + 1);
    double t = now();
    if (t >= next_report && t - t0 < opt.duration) {
      uint64_t so_far = 0;
      for (int k = 0; k < opt.threads; k++)
        so_far += atomic_load_explicit(&ws[k].batches, memory_order_relaxed);
      printf("progress: %.1f s, batch count %" PRIu64 ", throughput %.*f %s/s\n", t - t0, so_far,
             opt.report_precision, (double)so_far * bytes_per_batch / (t - t0) / unit,
             opt.report_unit);
      fflush(stdout);
      next_report += 1;
    }
  }
  atomic_store(&running, 0);
  if (rails) {
    atomic_store(&rails->stop, 1);
    pthread_join(rails->tid, NULL);
  }
  uint64_t batches = 0;
  int failed = 0;
  for (int t = 0; t < opt.threads; t++) {
    pthread_join(ws[t].tid, NULL);
    batches += atomic_load(&ws[t].batches);
    failed |= ws[t].failed;
  }
  double duration = now() - t0;
  double throughput = (double)batches * bytes_per_batch / duration / unit;
  printf("Test completed: duration %.2f, batch count %" PRIu64 ", throughput %.*f %s/s\n",
         duration, batches, opt.report_precision, throughput, opt.report_unit);
  print_latency(ws, (double)batches * (double)opt.batch_size / duration);
  print_footprint(ntargets);
  if (rails) {
    print_rails(rails, unit);
    free(rails);
  }
  fflush(stdout);

  int status = 0;
  if (failed) {
    fprintf(stderr, "transfer_bench: transfers FAILED (see above)\n");
    status = 1;
  } else if (opt.verify) {
    if (verify_after(ws) != 0) {
      fprintf(stderr, "transfer_bench: verification FAILED\n");
      status = 1;
    } else {
      printf("verify: OK (%s, %d threads x %" PRIu64 " blocks of %" PRIu64 " bytes)\n",
             opt.operation, opt.threads, opt.batch_size, opt.block_size);
    }
  }
  for (int t = 0; t < opt.threads; t++) free(ws[t].samples);
  free(ws);
  free(targets);
  release(e, buf);
  return status;
}

int main(int argc, char **argv) {
  parse_args(argc, argv);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  return !strcmp(opt.mode, "target") ? target_main() : initiator_main();
}
