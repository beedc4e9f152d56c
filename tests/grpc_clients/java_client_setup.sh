#!/usr/bin/env bash
# Makes grpc-java usable by tests/grpc_clients/JavaClient.java, best effort
# (scripts/test.sh runs it as root; without it the Java test says it is ignored):
# - Debian's grpc-java, netty and protobuf-java packages;
# - netty's epoll transport library (JNI), which Debian's netty ships without
#   its native part: compiled from the source package of the netty that is
#   installed, into DIR/native (a unix socket needs it: grpc-java reaches one
#   only through netty's epoll domain socket channel).
#
# Usage: bash tests/grpc_clients/java_client_setup.sh DIR   (DIR: target/grpc-clients/java)
set -euo pipefail
dir=$(realpath -m "$1")
lib=$dir/native/libnetty_transport_native_epoll_x86_64.so
say() { printf '  java client: %s\n' "$*"; }

[ "$(uname -m)" = x86_64 ] || { say "only set up on x86_64"; exit 1; }
command -v javac >/dev/null || { say "no JDK (javac)"; exit 1; }
cc=$(command -v cc || command -v gcc) || { say "no C compiler"; exit 1; }

packages=(libgrpc-java libnetty-java libprotobuf-java libperfmark-java)
installed() { [ "$(dpkg-query -W -f='${Status}\n' "$@" 2>/dev/null | grep -c 'install ok installed')" = $# ]; }
if ! installed "${packages[@]}"; then
  say "installing ${packages[*]}"
  timeout 300 apt-get update -qq >/dev/null 2>&1 || true
  DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -qq --no-install-recommends \
    "${packages[@]}" >/dev/null 2>&1 || { say "could not install ${packages[*]}"; exit 1; }
fi

netty=$(dpkg-query -W -f='${Version}' libnetty-java)
if [ -f "$lib" ] && [ "$(cat "$dir/native/netty-version" 2>/dev/null)" = "$netty" ]; then
  exit 0
fi
say "building netty $netty's epoll library into $dir/native"
work=$(mktemp -d "${TMPDIR:-/tmp}/netty-src.XXXXXX")
trap 'rm -rf "$work"' EXIT
# The source package through apt, with a list of its own: the machine's
# sources are left as they are.
mkdir -p "$work/lists/partial"
# shellcheck source=/dev/null
release=$(. /etc/os-release && echo "$VERSION_CODENAME")
cat > "$work/src.sources" <<EOF
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: $release $release-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://deb.debian.org/debian-security
Suites: $release-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
apt_src=(-o "Dir::Etc::SourceList=$work/src.sources" -o Dir::Etc::SourceParts=/nonexistent
  -o "Dir::State::Lists=$work/lists" -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache=
  -o APT::Sandbox::User=root)
(cd "$work" && timeout 300 apt-get "${apt_src[@]}" update -qq >/dev/null 2>&1 &&
  timeout 300 apt-get "${apt_src[@]}" source --download-only -qq "libnetty-java=$netty" >/dev/null 2>&1) ||
  { say "could not download netty's source package $netty"; exit 1; }
tar -C "$work" -xf "$work"/netty_*.orig.tar.*
src=$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'netty-*' | head -1)
jdk=$(dirname "$(dirname "$(readlink -f "$(command -v javac)")")")
mkdir -p "$dir/native"
"$cc" -shared -fPIC -O2 -w -I"$jdk/include" -I"$jdk/include/linux" \
  -I"$src/transport-native-unix-common/src/main/c" \
  "$src"/transport-native-epoll/src/main/c/*.c "$src"/transport-native-unix-common/src/main/c/*.c \
  -o "$lib.tmp" -ldl || { say "could not compile netty's epoll library"; exit 1; }
mv "$lib.tmp" "$lib"
echo "$netty" > "$dir/native/netty-version"
