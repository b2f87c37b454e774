#!/usr/bin/env bash
# Installs bpf-linker 0.13, built against Debian's LLVM 22, into a location that survives
# between CI runs on the same machine; skips the build when that version is already there.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

VERSION=0.13
TOOLS=${PENROSE_TOOLS:-/var/tmp/penrose-tools}
LLVM_PREFIX=/usr/lib/llvm-22

step "bpf-linker ${VERSION} (LLVM 22) in ${TOOLS}"
have=$("${TOOLS}/bin/bpf-linker" --version 2>/dev/null || true)
case "$have" in
    "bpf-linker ${VERSION}."*)
        echo "found: ${have}"
        ;;
    *)
        echo "building (found: ${have:-none})"
        # Any cargo works for this host tool; the LLVM it links is what matters.
        PATH="${LLVM_PREFIX}/bin:${PATH}" LLVM_SYS_220_PREFIX="${LLVM_PREFIX}" \
            cargo install --locked bpf-linker --version "^${VERSION}" \
            --no-default-features --features llvm-22 --root "${TOOLS}" --force
        "${TOOLS}/bin/bpf-linker" --version
        ;;
esac
step_done
