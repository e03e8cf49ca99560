#!/usr/bin/env bash
# The installed library as a user gets it (label install):
#  1. `cmake --install BUILD --prefix TMP`: headers, libraries, binaries, the CMake package and
#     tessera.pc land where they belong, and no internal header does;
#  2. a consumer project outside the tree finds it with find_package(Tessera), links the client
#     into a shared object and an executable, and runs against the installed tessera-server; it
#     includes <tessera/client.h> (PREFIX/include as the root, consumer/plugin.cc) and, in
#     consumer/old_include.cc, the deprecated "ps/client/client.h" (PREFIX/include/tessera);
#  3. the same program built by plain g++ with `pkg-config --cflags --libs tessera`;
#  4. with --subproject: the consumer takes Tessera's source tree as a sub-project with
#     TESSERA_CLIENT_ONLY=ON (as FetchContent would): no RocksDB, glog, gflags or Eigen looked up,
#     no test or benchmark target, and the client it builds works against the server.
# Usage: install_test.sh BUILD_DIR SOURCE_DIR [--subproject]
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
subproject=${3:-}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tessera-install.XXXXXX")
server_pid=""
cleanup() {
  if [[ -n $server_pid ]]; then kill -9 "$server_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "install_test: FAIL: $*" >&2; exit 1; }
gen=()
if command -v ninja >/dev/null; then gen=(-G Ninja); fi

# Starts PREFIX/bin/tessera-server on a free port of 127.0.0.1; sets $endpoint.
start_server() {
  local bin=$1 port
  port=$("$tmp/consumer-build/consumer" --free-port)
  endpoint="tcp://127.0.0.1:$port"
  "$bin" --listen="$endpoint" --cluster="$endpoint" --rank=0 >"$tmp/server.log" 2>&1 &
  server_pid=$!
}
stop_server() {
  kill -9 "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
}

if [[ $subproject != --subproject ]]; then
  # ---- 1. install
  prefix=$tmp/prefix
  cmake --install "$build" --prefix "$prefix" >"$tmp/install.log"
  for f in include/tessera/client.h include/tessera/export_reader.h include/tessera/status.h \
           include/tessera/table_spec.h include/tessera/server.h \
           include/tessera/ps/client/client.h include/tessera/ps/client/export_reader.h \
           include/tessera/ps/status.h include/tessera/ps/table_spec.h \
           lib/cmake/Tessera/TesseraConfig.cmake lib/cmake/Tessera/TesseraConfigVersion.cmake \
           lib/cmake/Tessera/TesseraTargets.cmake lib/pkgconfig/tessera.pc bin/tessera-server \
           bin/tessera-ctl; do
    [[ -e $prefix/$f ]] || fail "not installed: $f"
  done
  ls "$prefix"/lib/libtessera_client.* >/dev/null 2>&1 || fail "no libtessera_client"
  internal=$(find "$prefix/include" -name '*_internal.h' -o -name '*_test.cc' | head -1)
  [[ -z $internal ]] || fail "internal header installed: $internal"

  # ---- 2. find_package consumer
  cmake -S "$src/tests/install/consumer" -B "$tmp/consumer-build" "${gen[@]}" \
        -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >"$tmp/consumer-cmake.log" ||
    { cat "$tmp/consumer-cmake.log"; fail "find_package(Tessera) consumer did not configure"; }
  cmake --build "$tmp/consumer-build" >"$tmp/consumer-build.log" 2>&1 ||
    { cat "$tmp/consumer-build.log"; fail "find_package(Tessera) consumer did not build"; }
  start_server "$prefix/bin/tessera-server"
  "$tmp/consumer-build/consumer" "$endpoint" || { cat "$tmp/server.log"; fail "consumer run"; }

  # ---- 3. pkg-config
  export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
  flags=$(pkg-config --cflags --libs tessera) || fail "pkg-config --cflags --libs tessera"
  echo "install_test: pkg-config --cflags --libs tessera: $flags"
  # shellcheck disable=SC2086  # the flags are words
  c++ -O1 -o "$tmp/pc-consumer" "$src/tests/install/consumer/main.cc" \
      "$src/tests/install/consumer/plugin.cc" "$src/tests/install/consumer/old_include.cc" \
      -I"$src/tests/install/consumer" $flags ||
    fail "the consumer does not build with pkg-config's flags"
  stop_server
  start_server "$prefix/bin/tessera-server"  # a fresh (memory-only) server: rows start at 1
  "$tmp/pc-consumer" "$endpoint" || fail "pkg-config consumer run"
  stop_server
  # ---- the Python module, where the build has one
  if compgen -G "$build/python/tessera/_tessera*.so" >/dev/null; then
    py=/usr/bin/python3
    PYTHONPATH=$prefix/lib/python3/dist-packages "$py" -c \
      'import tessera; assert hasattr(tessera, "Client")' || fail "installed Python module"
    for f in _tessera.pyi py.typed; do
      [[ -f $prefix/lib/python3/dist-packages/tessera/$f ]] || fail "not installed: tessera/$f"
    done
  fi
  echo "install_test: installed package OK"
  exit 0
fi

# ---- 4. sub-project, client only
cmake -S "$src/tests/install/consumer" -B "$tmp/consumer-build" "${gen[@]}" \
      -DTESSERA_SOURCE_DIR="$src" -DTESSERA_CLIENT_ONLY=ON -DCMAKE_BUILD_TYPE=Release \
      >"$tmp/consumer-cmake.log" 2>&1 ||
  { cat "$tmp/consumer-cmake.log"; fail "client-only sub-project did not configure"; }
for dep in RocksDB_DIR glog_DIR Eigen3_DIR GTest_DIR; do
  if grep -q "^$dep:PATH=/" "$tmp/consumer-build/CMakeCache.txt"; then
    fail "the client-only configure looked up $dep"
  fi
done
targets=$(cmake --build "$tmp/consumer-build" --target help 2>/dev/null || true)
for t in tessera_storage tessera_server tessera_worker ps_unit_test bench_transport; do
  if grep -qw "$t" <<<"$targets"; then fail "the client-only sub-project has target $t"; fi
done
cmake --build "$tmp/consumer-build" >"$tmp/consumer-build.log" 2>&1 ||
  { cat "$tmp/consumer-build.log"; fail "client-only sub-project did not build"; }
start_server "$build/tessera-server"
"$tmp/consumer-build/consumer" "$endpoint" || { cat "$tmp/server.log"; fail "consumer run"; }
stop_server
echo "install_test: client-only sub-project OK"
