#!/usr/bin/env bash
# The shipped build of the example drivers: the `dist` profile (Cargo.toml:
# size-optimised, fat LTO) linked statically against glibc (static-pie), for
# the host's target. deploy/Dockerfile and the benchmark scripts
# (bench-hostpath.sh, bench-scale.sh) build with this, so they measure what
# ships. The arguments go to `cargo build`; the output directory
# (target/<host triple>/dist) is printed on stdout.
#   bash scripts/build-dist.sh -p hostpath --bin hostpath
#
# Why static: a dynamic build maps libc, ld.so, libm and libgcc_s whole (about
# 1.9 MB resident for some 160 functions); linked statically only the glibc
# code used is in the binary (about 0.7 MB), which cut hostpath's peak RSS by
# 1.4 MB (docs/benchmarks.md, "Peak RSS"). `-C target-feature=+crt-static` is
# a rustc flag, not a profile setting, and given without `--target` it also
# applies to build scripts and proc-macros, which then fail to build ("cannot
# produce proc-macro ... does not support these crate types"); with an explicit
# `--target` cargo gives RUSTFLAGS to the target's crates only. It is kept out
# of .cargo/config.toml for the same reason: there a target section would also
# apply to `cargo build` and `cargo test` without `--target`.
#
# For binaries that resolve no names only: with a static glibc, getaddrinfo and
# getpwnam & co. load the NSS modules of the glibc version linked against at
# run time. hostpath and loop-block link none of them. The `csi` client links
# getaddrinfo for tcp:// endpoints with a host name; the benchmarks reach the
# drivers over unix sockets, where it is not called. cloud-block's provider
# client resolves host names, so it is built with plain `cargo build --profile
# dist`. A static binary also carries its glibc: a glibc fix reaches it by
# rebuilding it.
set -euo pipefail
cd "$(dirname "$0")/.."
host=$(rustc -vV | sed -n 's/^host: //p')
[ -n "$host" ] || { echo "build-dist: no host triple from rustc -vV" >&2; exit 1; }
case $host in
  *-linux-gnu*) static="-C target-feature=+crt-static" ;;
  *) static= ;; # musl links statically anyway; elsewhere the default linking
esac
RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }$static" cargo build --profile dist --target "$host" "$@" >&2
echo "$PWD/target/$host/dist"
