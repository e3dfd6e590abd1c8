/* The CPU floor of a durable relay on this machine (issue 20 goal 2,
 * docs/BENCHMARKS.md "The floor of a durable relay"): the least CPU per
 * message any broker could spend to do what berth does in fanin, pagesize
 * and persist-2k-5q, with none of AMQP, routing, queues or an index.
 *
 * One server thread (this process) with epoll reads producers' messages
 * into one aligned buffer (one read per readable socket per turn), writes
 * the turn's bytes to a prepared file with O_DIRECT and fdatasyncs them,
 * then sends each producer one 8-byte ack covering its messages of the
 * turn and hands the turn's bytes to the consumers (round robin, one
 * blocking write each). The clients run in a child process: producers keep WINDOW
 * messages unacked (one write per message), consumers send back a 21-byte
 * ack per message (a basic.ack frame's size), one write per read.
 * Printed: the server's CPU (user + system, getrusage) and voluntary
 * sleeps per message over SECONDS after a one-second warm-up, and the
 * clients' CPU per message over their whole run.
 *
 *   gcc -O2 -pthread -o /tmp/relay-floor scripts/relay-floor.c
 *   flock /tmp/berth-bench.lock /tmp/relay-floor PRODUCERS WINDOW SIZE CONSUMERS SECONDS FILE
 *   e.g. fanin c20: 20 1 1024 0 10 DIR/f; persist-2k-5q: 5 100 2048 5 10 DIR/f
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define STAGE (4 << 20)
#define FILE_BYTES (256L << 20)
#define ACK_BYTES 21

static int producers, window_, size, consumers;
static struct sockaddr_in addr;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

static void die(const char *what) {
  perror(what);
  exit(1);
}

static int dial(char role) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr)) die("connect");
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (write(fd, &role, 1) != 1) die("role");
  return fd;
}

static void *producer(void *unused) {
  (void)unused;
  int fd = dial('p');
  char *msg = calloc(1, size);
  int64_t inflight = 0, ack;
  for (;;) {
    while (inflight < window_) {
      if (write(fd, msg, size) != size) return NULL;
      inflight++;
    }
    if (recv(fd, &ack, 8, MSG_WAITALL) != 8) return NULL;
    inflight -= ack;
  }
}

static void *consumer(void *unused) {
  (void)unused;
  int fd = dial('c');
  char *buf = malloc(1 << 20), *acks = calloc(1, (1 << 20) / 16 * ACK_BYTES);
  long bytes = 0;
  for (;;) {
    ssize_t r = read(fd, buf, 1 << 20);
    if (r <= 0) return NULL;
    long before = bytes / size;
    bytes += r;
    long n = bytes / size - before;
    if (n > 0 && write(fd, acks, n * ACK_BYTES) < 0) return NULL;
  }
}

static void clients(void) {
  pthread_t t;
  for (int i = 0; i < producers; i++) pthread_create(&t, NULL, producer, NULL);
  for (int i = 0; i < consumers; i++) pthread_create(&t, NULL, consumer, NULL);
  pause();
}

int main(int argc, char **argv) {
  if (argc != 7) {
    fprintf(stderr, "usage: relay-floor PRODUCERS WINDOW SIZE CONSUMERS SECONDS FILE\n");
    return 2;
  }
  producers = atoi(argv[1]);
  window_ = atoi(argv[2]);
  size = atoi(argv[3]);
  consumers = atoi(argv[4]);
  double seconds = atof(argv[5]);
  if (producers < 1 || window_ < 1 || size < 1 || consumers < 0 || seconds <= 0) {
    fprintf(stderr, "relay-floor: counts and sizes must be positive\n");
    return 2;
  }

  char *stage = aligned_alloc(4096, STAGE);
  memset(stage, 0, STAGE);
  int file = open(argv[6], O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0644);
  if (file < 0) die("open");
  for (long o = 0; o < FILE_BYTES; o += STAGE)
    if (pwrite(file, stage, STAGE, o) != STAGE) die("prepare");
  if (fdatasync(file)) die("fdatasync");

  int lis = socket(AF_INET, SOCK_STREAM, 0);
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (bind(lis, (struct sockaddr *)&addr, sizeof addr) || listen(lis, 128) ||
      getsockname(lis, (struct sockaddr *)&addr, &len))
    die("listen");

  pid_t child = fork();
  if (child == 0) clients();

  int total = producers + consumers;
  int *fds = calloc(total, sizeof(int)), *is_producer = calloc(total, sizeof(int));
  long *partial = calloc(total, sizeof(long)), *pending = calloc(total, sizeof(long));
  int *cons = calloc(consumers + 1, sizeof(int)), ncons = 0;
  int ep = epoll_create1(0);
  for (int i = 0; i < total; i++) {
    fds[i] = accept(lis, NULL, NULL);
    char role;
    if (fds[i] < 0 || read(fds[i], &role, 1) != 1) die("accept");
    int one = 1;
    setsockopt(fds[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    is_producer[i] = role == 'p';
    if (!is_producer[i]) cons[ncons++] = fds[i];
    if (is_producer[i]) fcntl(fds[i], F_SETFL, O_NONBLOCK);
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = i};
    epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &ev);
  }

  char *scratch = malloc(1 << 16);
  long off = 0, in = 0, syncs = 0, next_consumer = 0;
  double start = now() + 1.0, end = start + seconds;
  long in0 = 0, syncs0 = 0;
  struct rusage r0 = {0};
  int measuring = 0;
  struct epoll_event evs[64];
  for (;;) {
    double t = now();
    if (!measuring && t >= start) {
      measuring = 1;
      getrusage(RUSAGE_SELF, &r0);
      in0 = in;
      syncs0 = syncs;
    }
    if (t >= end) break;
    int n = epoll_wait(ep, evs, 64, 100);
    long fill = 0;
    for (int k = 0; k < n; k++) {
      int i = evs[k].data.u32;
      if (!is_producer[i]) {
        while (recv(fds[i], scratch, 1 << 16, MSG_DONTWAIT) > 0) {
        }
        continue;
      }
      if (fill == STAGE) continue;
      ssize_t got = read(fds[i], stage + fill, STAGE - fill > 65536 ? 65536 : STAGE - fill);
      if (got <= 0) continue;
      fill += got;
      partial[i] += got;
      pending[i] += partial[i] / size;
      in += partial[i] / size;
      partial[i] %= size;
    }
    if (fill == 0) continue;
    long aligned = (fill + 4095) & ~4095L;
    if (off + aligned > FILE_BYTES) off = 0;
    if (pwrite(file, stage, aligned, off) != aligned || fdatasync(file)) die("append");
    off += aligned;
    syncs++;
    for (int i = 0; i < total; i++) {
      if (pending[i] == 0) continue;
      int64_t ack = pending[i];
      pending[i] = 0;
      if (write(fds[i], &ack, 8) != 8) die("ack");
    }
    if (ncons > 0) {
      int fd = cons[next_consumer++ % ncons];
      for (long done = 0; done < fill;) {
        ssize_t w = write(fd, stage + done, fill - done);
        if (w <= 0) die("deliver");
        done += w;
      }
    }
  }
  struct rusage r1;
  getrusage(RUSAGE_SELF, &r1);
  kill(child, SIGKILL);
  waitpid(child, NULL, 0);
  struct rusage rc;
  getrusage(RUSAGE_CHILDREN, &rc);
  double client = rc.ru_utime.tv_sec + rc.ru_stime.tv_sec + (rc.ru_utime.tv_usec + rc.ru_stime.tv_usec) / 1e6;
  double cpu = (r1.ru_utime.tv_sec - r0.ru_utime.tv_sec) + (r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) +
               ((r1.ru_utime.tv_usec - r0.ru_utime.tv_usec) + (r1.ru_stime.tv_usec - r0.ru_stime.tv_usec)) / 1e6;
  long msgs = in - in0;
  /* The clients' CPU covers their whole life (warm-up too), over every
   * message they sent: a rough figure, for the CPU bound. */
  printf("producers %d window %d size %d consumers %d: %.0f msg/s, %.1f msg/sync, server CPU %.2f us/msg, %.3f sleeps/msg, clients %.2f us/msg\n",
         producers, window_, size, consumers, msgs / seconds, (double)msgs / (syncs - syncs0 ? syncs - syncs0 : 1),
         cpu * 1e6 / (msgs ? msgs : 1), (double)(r1.ru_nvcsw - r0.ru_nvcsw) / (msgs ? msgs : 1),
         client * 1e6 / (in ? in : 1));
  unlink(argv[6]);
  return 0;
}
