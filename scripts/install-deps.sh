#!/usr/bin/env bash
# Installs the Debian packages chorus builds and tests with, if any are missing.
set -euo pipefail
packages=(cmake g++ make pkg-config libgloo-dev liburing-dev nlohmann-json3-dev libcli11-dev libgtest-dev libbenchmark-dev libeigen3-dev
  pybind11-dev python3-dev python3-numpy python3-torch python3-sklearn python3-tqdm python3-pytest
  python3-venv python3-setuptools python3-wheel python3-matplotlib libopenmpi-dev openmpi-bin python3-mpi4py libtorch-dev
  iproute2 iptables openssh-client openssh-server openjdk-17-jre-headless)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
