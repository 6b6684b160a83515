#!/usr/bin/env bash
# Prepares this machine to run desktops with the LXC driver. Idempotent: run it as often as you like
# (make dev and CI do). Needs root.
#
#   image-build/host-setup.sh [--bridge lbbr0] [--subnet 10.213.0.0/24] [--python PYTHON]
#
# - installs the host packages (LXC, debootstrap, nftables, uidmap, e2fsprogs, ...);
# - maps root's subordinate ids 100000-165535 (/etc/subuid, /etc/subgid) for unprivileged containers;
# - raises the kernel's per-user limits that many containers share (inotify, keys);
# - creates the project's bridge with the host's address on it, turns on IPv4 forwarding and loads
#   the project's nftables tables (isolation between desktops, NAT for their egress).
set -euo pipefail

BRIDGE=lbbr0
SUBNET=10.213.0.0/24
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(dirname "$HERE")
PYTHON=python3
while [ $# -gt 0 ]; do
    case "$1" in
        --bridge) BRIDGE=$2; shift ;;
        --subnet) SUBNET=$2; shift ;;
        --python) PYTHON=$2; shift ;;
        -h | --help) sed -n '2,11p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done
[ "$(id -u)" = 0 ] || { echo "host-setup.sh must run as root" >&2; exit 1; }

PACKAGES=(lxc debootstrap nftables uidmap iproute2 e2fsprogs openssh-client mount util-linux python3 rsync)
echo "==> host packages: ${PACKAGES[*]}"
"$REPO/scripts/apt-ensure.sh" --no-recommends "${PACKAGES[@]}"

# Unprivileged containers: root's guests run as 100000-165535 on the host.
for f in /etc/subuid /etc/subgid; do
    grep -q '^root:100000:65536$' "$f" 2>/dev/null || echo 'root:100000:65536' >>"$f"
done
echo "==> subordinate ids for root: $(grep '^root:' /etc/subuid | tr '\n' ' ')"

# Debian's lxc-net would add its own bridge and dnsmasq; the project's bridge replaces them.
if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
    systemctl disable --now lxc-net.service >/dev/null 2>&1 || true
fi

# The kernel must offer what the driver uses; say so plainly rather than fail later.
for fs in overlay ext4; do
    grep -qw "$fs" /proc/filesystems || modprobe "$fs" 2>/dev/null ||
        { echo "this kernel has no $fs filesystem: desktops cannot run here" >&2; exit 1; }
done
[ -e /dev/loop-control ] || { echo "no /dev/loop-control: loop devices are needed for desktop disks" >&2; exit 1; }

# Every desktop's systemd, sshd and session run as the same host uid (100000), and the kernel's
# per-user limits count them together: at the defaults the ~18th desktop fails to boot.
cat >/etc/sysctl.d/60-lebureau.conf <<'EOF'
fs.inotify.max_user_instances = 8192
fs.inotify.max_user_watches = 1048576
kernel.keys.maxkeys = 20000
kernel.keys.maxbytes = 20000000
vm.max_map_count = 262144
net.ipv4.ip_forward = 1
EOF
sysctl -q -p /etc/sysctl.d/60-lebureau.conf
echo "==> kernel limits for many containers set (/etc/sysctl.d/60-lebureau.conf)"

echo "==> bridge $BRIDGE ($SUBNET) and nftables"
# Run as a file: this module needs only the standard library.
"$PYTHON" "$REPO/workers/drivers/lxc/network.py" --bridge "$BRIDGE" --subnet "$SUBNET"
mkdir -p /var/lib/lebureau/images /var/lib/lebureau/desktops /var/lib/lebureau/lxc
echo "==> host ready; build the golden image with: image-build/build.sh minimal"
