"""Real servers the relay tests dial: TigerVNC's Xvnc and OpenSSH's sshd on loopback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from contextlib import contextmanager, suppress
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        socket.create_connection((host, port), timeout=0.2).close()
        return True
    except OSError:
        return False


def wait_for_port(port: int, process: subprocess.Popen, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not port_open(port):
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[0]} exited with {process.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing listens on {port}")
        time.sleep(0.05)


def workers_answering(app, prefix: str) -> bool:
    """Whether a Celery worker whose node name starts with `prefix` answers a ping (not yet, while the
    broker itself is coming back)."""
    try:
        replies = app.control.ping(timeout=0.5)
    except app.connection_for_write().connection_errors:
        return False
    return any(name.startswith(prefix) for reply in replies for name in reply)


@contextmanager
def running(args: list[str], port: int, **kwargs):
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kwargs)
    try:
        wait_for_port(port, process)
        yield process
    finally:
        process.terminate()
        process.wait(timeout=10)


@contextmanager
def patched_environ(values: dict[str, str]):
    """Environment variables set for the block only (engines read their options from there)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def server_pid(port: int) -> int:
    """The web server serving `port`."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            command = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"lebureau.server" in command and str(port).encode() in command:
            return int(cmdline.parent.name)
    raise AssertionError(f"no web server serving port {port}")


def peak_memory(port: int) -> int:
    """The high-water mark of resident memory of the web server serving `port` (VmHWM), in bytes."""
    for line in Path(f"/proc/{server_pid(port)}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for the web server serving port {port}")


def held_in_temporary_files(pid: int) -> int:
    """What the process's open, deleted files (its temporary files) hold of the disk, in bytes."""
    held = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with suppress(OSError):
            if os.readlink(fd).endswith(" (deleted)"):
                held += fd.stat().st_blocks * 512
    return held


@contextmanager
def service_process(name: str, args: list[str], env: dict[str, str], log_dir: Path, ready):
    """Run one of the control plane's processes for the suite, until `ready()` is true."""
    log = open(log_dir / f"{name}.log", "w")  # noqa: SIM115 (lives with the process)
    # A session of its own: a test may kill the process and its children at once, as a crash would.
    process = subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline = time.monotonic() + 120
    while not ready():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"{name} did not start; see {log.name}")
        time.sleep(0.2)
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            # As a service manager does with a server that keeps long-lived streams open past its stop.
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


@contextmanager
def xvnc(geometry: str = "640x400", password_file: Path | None = None):
    """An X display served over RFB on a free loopback port, with an xterm drawn on it.

    With a password file, it asks for VNC authentication as a desktop's does (image-build/guest/vnc-session).
    """
    port = free_port()
    display = f":{port % 1000 + 100}"
    args = ["Xvnc", display, "-rfbport", str(port), "-localhost"]
    if password_file is None:
        args += ["-SecurityTypes", "None"]
    else:
        args += ["-SecurityTypes", "VncAuth", "-rfbauth", str(password_file)]
        args += ["-BlacklistThreshold", "1000000", "-BlacklistTimeout", "0"]
    with running([*args, "-geometry", geometry, "-depth", "24", "-AlwaysShared"], port):
        env = {**os.environ, "DISPLAY": display}
        xterm = subprocess.Popen(["xterm", "-geometry", "60x10+10+10"], env=env, stderr=subprocess.DEVNULL)
        try:
            yield display, port
        finally:
            xterm.terminate()


@contextmanager
def sshd(workdir: Path, authorized_key: str):
    """OpenSSH on a free loopback port, letting in root with the control plane's key only."""
    port = free_port()
    host_key = workdir / "host_ed25519"
    if not host_key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
    (workdir / "authorized_keys").write_text(authorized_key + "\n")
    # The sessions' home is the server's own, as a desktop's user has its own: bash run by sshd reads
    # ~/.bashrc, and the host's (a pyenv init there) must not run in every session; a rehash killed
    # half-way as a session ends leaves a lock that stalls every later session for a minute.
    home = workdir / "home"
    home.mkdir(exist_ok=True)
    config = workdir / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\n"
        f"AuthorizedKeysFile {workdir / 'authorized_keys'}\nPidFile {workdir / 'sshd.pid'}\n"
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\nStrictModes no\nUsePAM no\n"
        f"SetEnv HOME={home}\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)
    with running(["/usr/sbin/sshd", "-D", "-e", "-f", str(config)], port):
        yield port


def terminal_sessions_end() -> None:
    """End the shared terminal session (tmux) that a host sshd standing in for a desktop keeps for its
    terminals: a desktop keeps its own, a test or bench must not leave one for the next."""
    subprocess.run(["tmux", "-L", "bureau", "kill-server"], capture_output=True, check=False)
