#!/usr/bin/env bash
# Installs the system packages the whole project needs (docs/build.md). Idempotent: when every
# package is already installed it skips apt entirely.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

# Main workspace: C toolchain, GMP (big integers for Paillier), RocksDB 7.8 (linked, not
# built: .cargo/config.toml), clang for its bindgen.
# eBPF: Debian's rustc-web/cargo-web 1.96 (LLVM 22) and its library sources for build-std;
# llvm-22-dev (+ the libraries its llvm-config names) to build bpf-linker.
# chromium: the design server's HTML report is rendered headless in a test (about 124 MB to
# download, 414 MB installed with its 24 dependencies; without it that test says SKIPPED).
# tor: penrose-tornet's private Tor network on loopback (tor and tor-gencert; without them its
# test says SKIPPED).
# fonts-dejavu-core: the text of the design server's PNG plots (the package recommends it).
packages=(
    build-essential pkg-config libgmp-dev librocksdb-dev
    clang libclang-dev
    rustc-web cargo-web rust-web-src
    llvm-22-dev libpolly-22-dev zlib1g-dev libzstd-dev
    python3-pip
    chromium
    tor
    fonts-dejavu-core
)

step "apt packages: ${packages[*]}"
missing=()
for pkg in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$pkg")
    fi
done
if ((${#missing[@]})); then
    echo "missing: ${missing[*]}"
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
    $SUDO apt-get update -q
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
else
    echo "all installed"
fi
step_done

# The interop tests check our Paillier against the python-paillier implementation.
step "python: phe"
if python3 -c 'import phe' 2>/dev/null; then
    echo "phe already installed"
else
    # Debian marks the system python as externally managed; this is a CI machine.
    python3 -m pip install --quiet phe || python3 -m pip install --quiet --break-system-packages phe
fi
step_done

# promtool (Debian's prometheus package) checks the aggregation server's /metrics page in a
# test. Only the one binary is taken out of the package: installing the package would add a
# Prometheus server, its user and its unit, none of which the tests want.
step "promtool"
if command -v promtool >/dev/null 2>&1; then
    echo "promtool already installed: $(command -v promtool)"
else
    scratch=$(mktemp -d)
    # (The package lists may be older than the archive: update them once if the download fails.)
    (cd "$scratch" && { apt-get download -q prometheus || { apt-get update -q && apt-get download -q prometheus; }; } &&
        dpkg-deb -x prometheus_*.deb root)
    mkdir -p "$PENROSE_TOOLS/bin"
    install -m 0755 "$scratch/root/usr/bin/promtool" "$PENROSE_TOOLS/bin/promtool"
    rm -rf "$scratch"
    promtool --version | head -1
fi
step_done
