#!/usr/bin/env bash
# Builds a bootable qcow2 disk for a Proxmox VE template from a golden image build.
#
#   image-build/build-qcow2.sh [minimal|full] [--build ID] [--size GIB] [--output DIR] [--cache DIR] [--force]
#
# Source: OUTPUT/<profile>/<build-id>/rootfs made by build.sh (which runs first if the profile has no
# build), so the VM has the LXC desktop's packages and guest configuration (configure-guest.sh runs
# again after the VM packages), plus what a VM needs: kernel and initramfs, GRUB for BIOS on an MBR
# disk, cloud-init (NoCloud/ConfigDrive: Proxmox's user, SSH keys, IP), qemu-guest-agent, udev,
# systemd-networkd (DHCP on the first NIC), a serial console (ttyS0) and an fstab by UUID.
#
# Output, next to the rootfs it comes from (and removed with it): OUTPUT/<profile>/<build-id>/
# disk.qcow2, disk-packages.txt, and a "qcow2" entry (file, size, sha256, ...) in its image.json.
# An existing disk of that build is kept unless --force.
set -euo pipefail

PROFILE=minimal
OUTPUT=${LEBUREAU_IMAGES_DIR:-/var/lib/lebureau/images}
CACHE=${LEBUREAU_IMAGE_CACHE:-/var/cache/lebureau/image-build}
BUILD=current
SIZE_GIB=
FORCE=0
HERE=$(cd "$(dirname "$0")" && pwd)

while [ $# -gt 0 ]; do
    case "$1" in
        minimal | full) PROFILE=$1 ;;
        --build) BUILD=$2; shift ;;
        --size) SIZE_GIB=$2; shift ;;
        --output) OUTPUT=$2; shift ;;
        --cache) CACHE=$2; shift ;;
        --force) FORCE=1 ;;
        -h | --help) sed -n '2,15p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done
[ "$(id -u)" = 0 ] || { echo "build-qcow2.sh must run as root (loop devices, mount, chroot)" >&2; exit 1; }

START=$(date +%s)
step() { printf '\n==> [%4ss] %s\n' "$(($(date +%s) - START))" "$*"; }
die() { echo "build-qcow2: $*" >&2; exit 1; }

# Host tools: the build needs the first five; qemu-system-x86 and genisoimage are for the boot test
# (tests/image/test_qcow2_boot.py), installed here so one command readies a CI machine.
HOST_PACKAGES=(qemu-utils fdisk e2fsprogs util-linux mount python3 qemu-system-x86 genisoimage)
"$(dirname "$HERE")/scripts/apt-ensure.sh" --no-recommends "${HOST_PACKAGES[@]}"

# What the VM adds to the LXC package set.
VM_PACKAGES=(linux-image-amd64 initramfs-tools udev kmod grub-pc cloud-init cloud-guest-utils fdisk
    qemu-guest-agent systemd-resolved)

if [ "$BUILD" = current ] && [ ! -f "$OUTPUT/$PROFILE/current/image.json" ]; then
    step "no $PROFILE build yet: running build.sh $PROFILE"
    "$HERE/build.sh" "$PROFILE" --output "$OUTPUT" --cache "$CACHE"
fi
BUILD_DIR=$(realpath -e "$OUTPUT/$PROFILE/$BUILD") || die "no build $BUILD of $PROFILE in $OUTPUT"
if [ ! -d "$BUILD_DIR/rootfs" ] || [ ! -f "$BUILD_DIR/image.json" ]; then die "$BUILD_DIR is not a finished build"; fi
BUILD_ID=$(basename "$BUILD_DIR")
META="$BUILD_DIR/image.json"
DISK="$BUILD_DIR/disk.qcow2"
json_get() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1])).get(sys.argv[2], ""))' "$META" "$1"; }
ID_BASE=$(json_get id_base)

if [ "$FORCE" = 0 ] && [ -f "$DISK" ] && python3 - "$META" "$DISK" <<'EOF'
import json, os, sys
q = json.load(open(sys.argv[1])).get("qcow2") or {}
sys.exit(0 if q.get("size_bytes") == os.path.getsize(sys.argv[2]) else 1)
EOF
then
    step "already built: $DISK (--force to rebuild)"
    exit 0
fi

if [ -z "$SIZE_GIB" ]; then
    # The rootfs, ~1 GiB of kernel/initramfs/cloud-init, 1 GiB free; Proxmox grows it (growpart).
    SIZE_GIB=$(( ($(json_get size_bytes) + (1 << 30) - 1) / (1 << 30) + 2 ))
    [ "$SIZE_GIB" -ge 4 ] || SIZE_GIB=4
fi

WORK="$BUILD_DIR/.qcow2-work" # a dot name: build.sh's clean-up of old builds skips it
RAW="$WORK/disk.raw"
MNT="$WORK/mnt"
APT_CACHE="$CACHE/apt-vm" # the VM packages' .debs, kept between builds
LOOP=
MADE_NODE=
MADE_LINK=

release() {
    if [ -d "$MNT" ]; then
        umount -R "$MNT" 2>/dev/null || umount -R -l "$MNT" 2>/dev/null || true
    fi
    if [ -f "$RAW" ]; then
        # Also loops left by an earlier run that was killed before its trap could run.
        for l in $(losetup -n -O NAME -j "$RAW"); do losetup -d "$l" || true; done
    fi
    if [ -n "$MADE_NODE" ]; then rm -f "$MADE_NODE"; fi
    if [ -n "$MADE_LINK" ]; then
        rm -f "$MADE_LINK"
        rmdir /dev/disk/by-uuid /dev/disk 2>/dev/null || true # only if empty, as they were
    fi
    # Never follow a mount that is somehow still there (dev, proc, sys are the host's).
    if findmnt -rn -o TARGET | grep -qF "$WORK/"; then
        echo "build-qcow2: mounts remain under $WORK, not removing it" >&2
    else
        rm -rf --one-file-system "$WORK"
    fi
    rm -f "$DISK.tmp"
    return 0
}
on_exit() {
    local rc=$?
    release
    [ "$rc" = 0 ] || echo "build-qcow2 failed (exit $rc): mounts, loop devices and work files removed" >&2
}
# One run per build at a time: the next line would otherwise tear down another run's mounts.
exec 9>"$BUILD_DIR/.qcow2.lock"
flock -n 9 || die "another build-qcow2.sh is working on $BUILD_DIR"
trap on_exit EXIT
release # leftovers of a killed run

in_root() { chroot "$MNT" /usr/bin/env LC_ALL=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"; }

step "disk: ${SIZE_GIB} GiB raw, one bootable MBR partition, ext4 ($BUILD_ID of $PROFILE)"
mkdir -p "$MNT" "$APT_CACHE/partial"
truncate -s "${SIZE_GIB}G" "$RAW"
# 1 MiB before the partition: room for GRUB's core.img after the MBR.
printf 'label: dos\nstart=2048, type=83, bootable\n' | sfdisk -q "$RAW"
LOOP=$(losetup -f --show -P "$RAW")
PART="${LOOP}p1"
SYS="/sys/class/block/$(basename "$LOOP")p1"
for _ in $(seq 50); do
    [ -e "$SYS/dev" ] && break
    partx -a "$LOOP" 2>/dev/null || true # the kernel's own scan can be late or missing in containers
    sleep 0.1
done
[ -e "$SYS/dev" ] || die "the kernel shows no partition on $LOOP"
IFS=: read -r MAJ MIN <"$SYS/dev"
# Without udev (containers) nothing makes the node, or a stale one of an earlier loop may remain.
if [ ! -b "$PART" ] || [ "$(stat -c '%t:%T' "$PART")" != "$(printf '%x:%x' "$MAJ" "$MIN")" ]; then
    rm -f "$PART"
    mknod -m 600 "$PART" b "$MAJ" "$MIN"
    MADE_NODE=$PART
fi
# GRUB 2.06 (bookworm) cannot read ext4 with metadata_csum_seed or orphan_file.
mkfs.ext4 -q -L bureau-root -O '^metadata_csum_seed,^orphan_file' "$PART"
ROOT_UUID=$(blkid -s UUID -o value "$PART")
mount "$PART" "$MNT"

step "copying the rootfs, ids unshifted by $ID_BASE (a VM has no user namespace)"
cp -a "$BUILD_DIR/rootfs/." "$MNT/"
python3 - "$MNT" "$ID_BASE" <<'EOF'
# The inverse of shift_ids.py: ids in [base, base + 65536) go back to [0, 65536).
import os, stat, sys
root, base = sys.argv[1], int(sys.argv[2])
back = lambda i: i - base if base <= i < base + 65536 else i
count = 0
for path in [root] + [os.path.join(d, n) for d, ds, fs in os.walk(root) for n in ds + fs]:
    st = os.lstat(path)
    if (back(st.st_uid), back(st.st_gid)) != (st.st_uid, st.st_gid):
        os.lchown(path, back(st.st_uid), back(st.st_gid))
        if not stat.S_ISLNK(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
            os.chmod(path, stat.S_IMODE(st.st_mode))  # chown cleared them
        count += 1
print(f"  unshifted {count} paths")
EOF

step "VM packages: ${VM_PACKAGES[*]}"
mount -t proc proc "$MNT/proc"
mount -t sysfs sysfs "$MNT/sys"
mount --bind /dev "$MNT/dev"
mount --bind /dev/pts "$MNT/dev/pts"
mount --bind "$APT_CACHE" "$MNT/var/cache/apt/archives"
# The guest's resolv.conf is empty (the driver or cloud-init fills it): apt needs the host's now.
rm -f "$MNT/etc/resolv.conf"
cp -L /etc/resolv.conf "$MNT/etc/resolv.conf"
printf '#!/bin/sh\nexit 101\n' >"$MNT/usr/sbin/policy-rc.d" # no service starts in the chroot
chmod 755 "$MNT/usr/sbin/policy-rc.d"
# Before the kernel's initramfs is made: the root fs type for its fsck hook, no resume device.
printf 'UUID=%s / ext4 errors=remount-ro 0 1\n' "$ROOT_UUID" >"$MNT/etc/fstab"
install -d "$MNT/etc/initramfs-tools/conf.d"
echo RESUME=none >"$MNT/etc/initramfs-tools/conf.d/bureau"
install -D -m 644 "$HERE/guest-vm/grub.cfg" "$MNT/etc/default/grub.d/bureau.cfg"
# grub-pc's postinst would ask where to install; this script installs it itself below.
printf 'grub-pc grub-pc/install_devices multiselect\ngrub-pc grub-pc/install_devices_empty boolean true\n' |
    in_root debconf-set-selections
in_root apt-get update -q | sed -n '/^\(Err\|E:\|W:\)/p'
in_root apt-get install -y -q --no-install-recommends "${VM_PACKAGES[@]}" |
    grep --line-buffered -E '^(Get:|Setting up|Fetched|E:|update-initramfs)' |
    awk '/^Get:/ { g++; if (g % 25 == 1) { print "  downloading... (" g " files)"; fflush() }; next }
         /^Setting up/ { s++; if (s % 25 == 1) { print "  configuring... (" s " packages)"; fflush() }; next }
         { print "  " $0; fflush() }'
KERNEL=$(cd "$MNT/boot" && find . -maxdepth 1 -name 'vmlinuz-*' -printf '%f\n' | sort -V | tail -1)
if [ -z "$KERNEL" ] || [ ! -f "$MNT/boot/initrd.img-${KERNEL#vmlinuz-}" ]; then die "no kernel or initramfs in /boot"; fi

step "guest configuration: configure-guest.sh $PROFILE, then the VM's own"
"$HERE/configure-guest.sh" "$MNT" "$PROFILE"
# Undo the container-only masks that a VM needs: root remount, consoles, kernel mounts and modules,
# sysctl, trim, and the generators (fstab, serial console, disks).
for unit in systemd-remount-fs.service systemd-networkd-wait-online.service getty@tty1.service \
    fstrim.timer systemd-pstore.service sys-kernel-config.mount sys-kernel-debug.mount \
    sys-kernel-tracing.mount dev-hugepages.mount dev-mqueue.mount systemd-update-utmp.service \
    systemd-update-utmp-runlevel.service systemd-sysusers.service systemd-sysctl.service \
    systemd-modules-load.service; do
    f="$MNT/etc/systemd/system/$unit"
    if [ "$(readlink "$f" 2>/dev/null)" = /dev/null ]; then rm -f "$f"; fi
done
rm -rf "$MNT/etc/systemd/system-generators"
install -D -m 644 "$HERE/guest-vm/cloud-init.cfg" "$MNT/etc/cloud/cloud.cfg.d/90-bureau.cfg"
install -D -m 644 "$HERE/guest-vm/90-bureau-dhcp.network" "$MNT/etc/systemd/network/90-bureau-dhcp.network"
install -D -m 644 "$HERE/guest-vm/wait-online.conf" \
    "$MNT/etc/systemd/system/systemd-networkd-wait-online.service.d/bureau.conf"
install -m 644 "$HERE/guest-vm/bureau-ssh-hostkey.service" "$MNT/etc/systemd/system/"
in_root systemctl enable systemd-networkd.service systemd-resolved.service bureau-ssh-hostkey.service \
    2>&1 | sed 's/^/  /'
# DNS from DHCP or cloud-init through systemd-resolved (configure-guest.sh emptied resolv.conf).
ln -sfn ../run/systemd/resolve/stub-resolv.conf "$MNT/etc/resolv.conf"

step "bootloader: GRUB (i386-pc) on $LOOP, grub.cfg for root=UUID=$ROOT_UUID"
# update-grub writes root=UUID= only if udev's /dev/disk/by-uuid link exists; no udev here maybe.
if [ ! -e "/dev/disk/by-uuid/$ROOT_UUID" ]; then
    mkdir -p /dev/disk/by-uuid
    ln -s "$PART" "/dev/disk/by-uuid/$ROOT_UUID"
    MADE_LINK="/dev/disk/by-uuid/$ROOT_UUID"
fi
in_root grub-install --target=i386-pc --modules='part_msdos ext2' "$LOOP" 2>&1 | sed 's/^/  /'
in_root update-grub 2>&1 | sed 's/^/  /'
grep -q "root=UUID=$ROOT_UUID" "$MNT/boot/grub/grub.cfg" || die "grub.cfg does not boot root=UUID=$ROOT_UUID"

step "metadata, first-boot state"
# shellcheck disable=SC2016 # dpkg-query's format, not the shell's
in_root dpkg-query -W -f '${Package}=${Version}\n' | LC_ALL=C sort >"$WORK/disk-packages.txt"
rm -f "$MNT/usr/sbin/policy-rc.d" "$MNT"/etc/ssh/ssh_host_*
# Every VM cloned from the template is a new instance to cloud-init and systemd.
rm -rf "$MNT/var/lib/cloud"/* "$MNT/var/log/cloud-init"*
: >"$MNT/etc/machine-id"
umount -R "$MNT/var/cache/apt/archives" "$MNT/dev" "$MNT/proc" "$MNT/sys"
# Discarded blocks become holes in the raw file, so they cost nothing in the qcow2.
fstrim "$MNT" || true
umount "$MNT"
e2fsck -f -p "$PART" >/dev/null || [ $? -le 1 ] # 1: something was fixed
losetup -d "$LOOP"
LOOP=

step "qcow2: qemu-img convert -c ($(du -h "$RAW" | cut -f1) used of ${SIZE_GIB} GiB)"
qemu-img convert -c -O qcow2 "$RAW" "$DISK.tmp"
mv "$DISK.tmp" "$DISK"
mv "$WORK/disk-packages.txt" "$BUILD_DIR/disk-packages.txt"
SHA=$(sha256sum "$DISK" | cut -d' ' -f1)
python3 - "$META" "$DISK" "$SHA" "$SIZE_GIB" "$KERNEL" "$ROOT_UUID" "${VM_PACKAGES[*]}" <<'EOF'
import datetime, hashlib, json, os, sys
meta, disk, sha, size_gib, kernel, uuid, extra = sys.argv[1:]
data = json.load(open(meta))
packages = os.path.join(os.path.dirname(disk), "disk-packages.txt")
data["qcow2"] = {
    "file": os.path.basename(disk),
    "size_bytes": os.path.getsize(disk),
    "virtual_size_bytes": int(size_gib) << 30,
    "sha256": sha,
    "built_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "kernel": kernel.removeprefix("vmlinuz-"),
    "root_uuid": uuid,
    "boot": "bios-grub-mbr",
    "extra_packages": extra.split(),
    "packages_file": os.path.basename(packages),
    "packages_sha256": hashlib.sha256(open(packages, "rb").read()).hexdigest(),
}
with open(meta + ".tmp", "w") as f:
    json.dump(data, f, indent=2)
os.replace(meta + ".tmp", meta)
EOF
step "done: $DISK ($(du -h --apparent-size "$DISK" | cut -f1), sha256 $SHA, kernel ${KERNEL#vmlinuz-})"
