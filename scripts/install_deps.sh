#!/usr/bin/env bash
# Installs every system dependency deepinfer needs on a fresh Debian machine.
# Idempotent: re-running it only installs what is missing.
set -euo pipefail

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libpcre2-dev libutf8proc-dev
  python3 python3-pip python3-dev python3-venv
)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Python packages are only for the Python-side tests and cross-checks (oracles such as HF tokenizers).
if [[ "${DEEPINFER_SKIP_PIP:-0}" != "1" ]]; then
  python3 -m pip install -q --disable-pip-version-check -r "$(dirname "$0")/../requirements-test.txt" || \
    python3 -m pip install -q --disable-pip-version-check --break-system-packages -r "$(dirname "$0")/../requirements-test.txt"
fi
