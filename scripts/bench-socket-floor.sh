#!/usr/bin/env bash
# The floor under a call to an idle process on this machine: one 200-byte
# message over a unix stream socket to another process that waits in
# epoll_wait, and its echo back, with no gRPC, HTTP/2 or runtime on either
# side. Printed as p50/p90 of 400 round trips in a tight loop and after a
# pause before each, to set beside `bash scripts/bench-idle-calls.sh` (a
# Probe through the gRPC stacks; docs/benchmarks.md).
#
# Usage: bash scripts/bench-socket-floor.sh [pauses in µs, default "0 12000 40000"]
# FLOOR_APART=1 pins the caller to CPU 0 and the echoing process to CPU 1: the
# round trip when the scheduler has put the two on different CPUs (each
# message then wakes a CPU that may have halted). Left alone, the scheduler
# usually runs such a pair on one CPU.
# Needs a C compiler (cc); builds into a temporary directory it removes.
set -euo pipefail
command -v cc >/dev/null || { echo "bench-socket-floor: needs cc" >&2; exit 1; }
work=$(mktemp -d /tmp/bench-socket-floor.XXXXXX)
trap 'rm -rf "$work"' EXIT

cat >"$work/floor.c" <<'C'
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>

enum { CALLS = 400, LEN = 200 };

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Waits for fd to be readable as an idle event loop does. */
static int waiter(int fd) {
  int ep = epoll_create1(0);
  struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
  if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0) exit(1);
  return ep;
}

static void roundtrip_read(int ep, int fd, char *buf) {
  struct epoll_event ev;
  size_t got = 0;
  while (got < LEN) {
    if (epoll_wait(ep, &ev, 1, -1) < 1) continue;
    ssize_t n = read(fd, buf + got, LEN - got);
    if (n <= 0) exit(n == 0 ? 0 : 1);
    got += (size_t)n;
  }
}

/* Runs the calling process on `cpu` alone. */
static void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set) < 0) exit(1);
}

int main(int argc, char **argv) {
  long pause_us = argc > 1 ? atol(argv[1]) : 0;
  int apart = argc > 2 && atoi(argv[2]);
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0) return 1;
  pid_t echo = fork();
  if (echo == 0) {
    if (apart) pin(1);
    close(sv[0]);
    int ep = waiter(sv[1]);
    char buf[LEN];
    for (;;) {
      roundtrip_read(ep, sv[1], buf);
      if (write(sv[1], buf, LEN) != LEN) return 1;
    }
  }
  if (apart) pin(0);
  close(sv[1]);
  int ep = waiter(sv[0]);
  char buf[LEN];
  memset(buf, 1, LEN);
  double took[CALLS];
  for (int i = 0; i < CALLS; i++) {
    if (pause_us) usleep((useconds_t)pause_us);
    double start = now_us();
    if (write(sv[0], buf, LEN) != LEN) return 1;
    roundtrip_read(ep, sv[0], buf);
    took[i] = now_us() - start;
  }
  close(sv[0]);
  waitpid(echo, NULL, 0);
  qsort(took, CALLS, sizeof took[0], by_value);
  printf("pause %ld us%s: round trip p50 %.1f us, p90 %.1f us\n", pause_us,
         apart ? ", on two CPUs" : "", took[CALLS / 2], took[CALLS * 9 / 10]);
  return 0;
}
C
cc -O2 -o "$work/floor" "$work/floor.c"
for pause in ${1:-0 12000 40000}; do
  "$work/floor" "$pause" "${FLOOR_APART:-0}"
done
