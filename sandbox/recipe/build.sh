#!/usr/bin/env bash
# Offline recipe for the agentrl sandbox rootfs (no registry needed; Debian mirror only).
#
#   sandbox/recipe/build.sh OUT_TAR CACHE_DIR
#
# Writes a rootfs tarball to OUT_TAR: Debian bookworm minbase + packages.txt, a non-root user
# `agent` (uid/gid 1000, home /home/agent), an empty /workspace owned by it, no setuid/setgid bits,
# no apt lists. The downloaded .debs are cached in CACHE_DIR/debs-<hash>.tgz (keyed by suite,
# mirror and package list), so a rebuild after a recipe tweak does not download again.
# Needs root (debootstrap, chroot) and debootstrap (sandbox/provision.sh installs it).
set -euo pipefail

OUT="${1:?usage: build.sh OUT_TAR CACHE_DIR}"
CACHE="${2:?usage: build.sh OUT_TAR CACHE_DIR}"
mkdir -p "$CACHE"
CACHE="$(cd "$CACHE" && pwd)"
HERE="$(cd "$(dirname "$0")" && pwd)"
SUITE="${AGENTRL_SANDBOX_SUITE:-bookworm}"
MIRROR="${AGENTRL_SANDBOX_MIRROR:-http://deb.debian.org/debian}"
PKGS="$(grep -v '^\s*#' "$HERE/packages.txt" | tr -s ' \n' ',' | sed 's/^,//; s/,$//')"

command -v debootstrap >/dev/null || { echo "debootstrap missing: run sandbox/provision.sh" >&2; exit 2; }
mkdir -p "$CACHE"
key="$(printf '%s\n%s\n%s\n' "$SUITE" "$MIRROR" "$PKGS" | sha256sum | cut -c1-16)"
DEBS="$CACHE/debs-$key.tgz"
WORK="$(mktemp -d "$CACHE/build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

if [ ! -s "$DEBS" ]; then
    echo "recipe: downloading packages ($PKGS) from $MIRROR" >&2
    debootstrap --variant=minbase --include="$PKGS" --make-tarball="$WORK/debs.tgz" \
        "$SUITE" "$WORK/dl" "$MIRROR" >&2
    mv "$WORK/debs.tgz" "$DEBS"
    rm -rf "$WORK/dl"
fi

ROOT="$WORK/rootfs"
echo "recipe: unpacking rootfs from $DEBS" >&2
debootstrap --variant=minbase --include="$PKGS" --unpack-tarball="$DEBS" "$SUITE" "$ROOT" "$MIRROR" >&2

# The unprivileged user the sandbox runs as, and its workspace.
chroot "$ROOT" groupadd --gid 1000 agent
chroot "$ROOT" useradd --uid 1000 --gid 1000 --create-home --shell /bin/bash agent
install -d -o 1000 -g 1000 -m 0755 "$ROOT/workspace"
# Defense in depth: no setuid/setgid programs (runtime already sets no-new-privileges, drops caps).
find "$ROOT" -xdev -type f \( -perm -4000 -o -perm -2000 \) -exec chmod ug-s {} +
# Small and host-neutral: no package lists/caches, no host resolver/hostname baked in.
rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/apt/* "$ROOT"/var/cache/debconf/*-old \
    "$ROOT"/var/log/* "$ROOT"/tmp/* "$ROOT"/etc/resolv.conf "$ROOT"/etc/hostname \
    "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* "$ROOT"/usr/share/locale/*

tar -C "$ROOT" --numeric-owner -cf "$OUT.part" .
mv "$OUT.part" "$OUT"
echo "recipe: wrote $OUT ($(du -h "$OUT" | cut -f1))" >&2
