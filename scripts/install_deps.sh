#!/usr/bin/env bash
# Installs Tessera's build and test dependencies from Debian packages, only those missing;
# with arguments, those packages instead (scripts/install_bench_deps.sh). Works as root or with
# sudo. Safe to run repeatedly.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config
      python3-venv python3-setuptools python3-wheel  # pip install . (python/README.md)
      libzmq3-dev cppzmq-dev libflatbuffers-dev flatbuffers-compiler
      librocksdb-dev libgoogle-glog-dev libgflags-dev libgtest-dev libgmock-dev
      libabsl-dev libeigen3-dev libxxhash-dev libcpp-httplib-dev nlohmann-json3-dev
      pybind11-dev python3-dev python3-numpy python3-torch libyaml-cpp-dev etcd-server
      clang)  # clang++: the thread-safety analysis (scripts/check_thread_safety.sh)
if (($# > 0)); then pkgs=("$@"); fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
echo "install_deps: installing ${missing[*]}" >&2
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
