"""Files into and out of a running desktop, over SFTP, for those who may take control of it.

Paths are the agent's: relative to its home, or absolute inside it; nothing outside the home is
reached, through `..` or through a symbolic link (each path is resolved by the desktop before use).
A file comes out as it is, a folder as a zip; both stream, and neither may exceed the plan's
transfer size. An upload lands under a temporary name and takes its own only once complete: a
broken upload leaves nothing half-written. Each transfer is audited.
"""

from __future__ import annotations

import posixpath
import re
import stat
import uuid
import zipfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

import paramiko
from django.utils.translation import gettext as _

from desktops.audit import Actor, audit_record
from desktops.errors import Conflict, Invalid, NotFound, TooLarge, Unavailable
from desktops.guest import desktop_ssh_connect
from desktops.long_calls import LongCall, database_let_go
from desktops.models import Desktop, DesktopState
from desktops.selectors import desktop_get, workspace_for_control

CHUNK = 256 * 1024
# How long a transfer's slot is kept at most should its process die without giving it back.
TRANSFER_SECONDS = 3600
MIB = 1024 * 1024


@dataclass
class Download:
    name: str  # what the browser saves it as
    content_type: str
    size: int | None  # None for a folder's zip, whose size is known only once made
    chunks: Iterator[bytes]


def desktop_file_download(*, actor: Actor, desktop_id: str, path: str) -> Download:
    """A file of the desktop, or one of its folders as a zip, to stream out."""
    desktop = _desktop_for_files(actor=actor, desktop_id=desktop_id)
    slot = LongCall(actor, TRANSFER_SECONDS)
    try:
        session = _Session.open(desktop)
    except BaseException:
        slot.end()
        raise
    session.slot = slot
    try:
        target = session.confined(path)
        info = session.stat(target)
        cap = desktop.plan.transfer_max_mib * MIB
        if stat.S_ISDIR(info.st_mode):
            entries = list(session.walk(target))
            total = sum(size for _path, size, _mtime in entries)
            _check_size(total, cap)
            name, content_type, size = f"{posixpath.basename(target) or 'home'}.zip", "application/zip", None
            chunks = _zip_chunks(session, target, entries)
        elif stat.S_ISREG(info.st_mode):
            _check_size(info.st_size, cap)
            name, content_type, size = posixpath.basename(target), "application/octet-stream", info.st_size
            chunks = session.read(target, info.st_size)
        else:
            raise Invalid(_("%(path)s is neither a file nor a folder.") % {"path": path})
    except BaseException:
        session.close()
        raise
    audit_record(
        actor=actor,
        action="desktop.file_download",
        workspace_id=desktop.workspace_id,
        target=desktop.id,
        path=target,
    )
    database_let_go()
    return Download(name, content_type, size, session.closing(chunks))


def desktop_file_upload(
    *, actor: Actor, desktop_id: str, path: str, length: int | None, chunks: Iterable[bytes]
) -> str:
    """Write a file into the desktop (its folders made as needed); the path it was written to."""
    desktop = _desktop_for_files(actor=actor, desktop_id=desktop_id)
    if length is None:
        raise Invalid(_("Say the file's size (Content-Length) before sending it."))
    _check_size(length, desktop.plan.transfer_max_mib * MIB)
    with LongCall(actor, TRANSFER_SECONDS), _Session.opened(desktop) as session:
        target = session.confined(path, must_exist=False)
        if target == session.home:
            raise Invalid(_("Name the file to write, not the home folder."))
        session.makedirs(posixpath.dirname(target))
        database_let_go()  # the body comes at the sender's pace
        written = session.write(target, length, chunks)
    audit_record(
        actor=actor,
        action="desktop.file_upload",
        workspace_id=desktop.workspace_id,
        target=desktop.id,
        path=target,
        bytes=written,
    )
    return target


def _desktop_for_files(*, actor: Actor, desktop_id: str) -> Desktop:
    desktop = desktop_get(actor=actor, desktop_id=desktop_id)
    # Files reach what the desktop holds, as its terminal does: the same role as taking control.
    workspace_for_control(actor=actor, workspace_id=desktop.workspace_id)
    if desktop.state != DesktopState.RUNNING or not desktop.private_ip:
        raise Conflict(
            _("The desktop is %(state)s: files move in and out of a running one.")
            % {"state": desktop.get_state_display()}
        )
    return desktop


def _check_size(size: int, cap: int) -> None:
    if size > cap:
        raise TooLarge(
            _("%(size)s MiB is more than this desktop's plan moves at once (%(cap)s MiB).")
            % {"size": round(size / MIB, 1), "cap": cap // MIB}
        )


class _Session:
    """One SSH connection's SFTP session in the desktop, rooted at the agent's home."""

    def __init__(self, ssh: paramiko.SSHClient):
        self.ssh, self.sftp = ssh, ssh.open_sftp()
        self.home = self.sftp.normalize(".")
        self.slot: LongCall | None = None  # a download's, given back with the connection

    @classmethod
    def open(cls, desktop: Desktop) -> _Session:
        try:
            return cls(desktop_ssh_connect(desktop_id=desktop.id, host=desktop.private_ip))
        except (paramiko.SSHException, OSError) as exc:
            raise Unavailable(_("The desktop is not answering: try again in a moment.")) from exc

    @classmethod
    @contextmanager
    def opened(cls, desktop: Desktop):
        session = cls.open(desktop)
        try:
            yield session
        finally:
            session.close()

    def close(self) -> None:
        self.ssh.close()
        if self.slot is not None:
            self.slot.end()

    def closing(self, chunks: Iterator[bytes]) -> Iterator[bytes]:
        """The chunks, then the connection closed (also when the reader stops early)."""
        try:
            yield from chunks
        finally:
            self.close()

    def _inside(self, path: str) -> bool:
        return path == self.home or path.startswith(self.home.rstrip("/") + "/")

    def confined(self, path: str, *, must_exist: bool = True) -> str:
        """The absolute path meant, resolved by the desktop, if it is inside the home."""
        if not path or "\0" in path:
            raise Invalid(_("Give a path in the agent's home."))
        wanted = posixpath.normpath(posixpath.join(self.home, path))
        if not self._inside(wanted):
            raise Invalid(_("%(path)s is outside the agent's home.") % {"path": path})
        # Resolve links: the longest part of the path that exists, then the rest as asked.
        existing, rest = wanted, ""
        while True:
            try:
                resolved = self.sftp.normalize(existing)
                break
            except OSError:
                if must_exist:
                    raise NotFound(_("%(path)s is not in the desktop.") % {"path": path}) from None
                existing, tail = posixpath.split(existing)
                rest = posixpath.join(tail, rest) if rest else tail
        target = posixpath.join(resolved, rest) if rest else resolved
        if not self._inside(target):
            raise Invalid(_("%(path)s leads outside the agent's home.") % {"path": path})
        return target

    def stat(self, path: str) -> paramiko.SFTPAttributes:
        try:
            return self.sftp.stat(path)
        except OSError:
            raise NotFound(_("%(path)s is not in the desktop.") % {"path": path}) from None

    def walk(self, folder: str) -> Iterator[tuple[str, int, int]]:
        """(path, size, mtime) of each regular file under the folder; links are not followed."""
        for entry in self.sftp.listdir_attr(folder):
            path = posixpath.join(folder, entry.filename)
            if stat.S_ISDIR(entry.st_mode):
                yield from self.walk(path)
            elif stat.S_ISREG(entry.st_mode):
                yield path, entry.st_size, entry.st_mtime

    def read(self, path: str, size: int) -> Iterator[bytes]:
        """The file's first `size` bytes, its size when its size was checked: one that grows meanwhile
        streams no more than was counted against the plan (and announced as its length)."""
        with self.sftp.open(path, "rb") as f:
            f.prefetch(size)
            left = size
            while left and (chunk := f.read(min(CHUNK, left))):
                left -= len(chunk)
                yield chunk

    def makedirs(self, folder: str) -> None:
        if folder == self.home or self._exists(folder):
            return
        self.makedirs(posixpath.dirname(folder))
        self.sftp.mkdir(folder, mode=0o755)

    def _exists(self, path: str) -> bool:
        try:
            self.sftp.stat(path)
        except OSError:
            return False
        return True

    def write(self, target: str, length: int, chunks: Iterable[bytes]) -> int:
        partial = f"{target}.{uuid.uuid4().hex[:12]}.partial"
        written = 0
        try:
            with self.sftp.open(partial, "wb") as f:
                f.set_pipelined(True)
                for chunk in chunks:
                    written += len(chunk)
                    if written > length:
                        raise Invalid(_("The upload is longer than its Content-Length."))
                    f.write(chunk)
            if written != length:
                raise Invalid(_("The upload ended before its Content-Length: nothing was written."))
            self.sftp.posix_rename(partial, target)
        except BaseException:
            if self._exists(partial):
                self.sftp.remove(partial)
            raise
        return written


class _Sink:
    """Where the zip writes: kept until the generator hands it on (a zip needs no seeking)."""

    def __init__(self):
        self.parts: list[bytes] = []
        self.offset = 0

    def write(self, data: bytes) -> int:
        self.parts.append(bytes(data))
        self.offset += len(data)
        return len(data)

    def tell(self) -> int:
        return self.offset

    def flush(self) -> None:
        pass

    def take(self) -> bytes:
        data, self.parts = b"".join(self.parts), []
        return data


# Characters that an extractor on another system may take for a separator, a drive or a device, and
# control characters: in an entry's name each becomes "_", so no name the agent chose climbs out of the
# folder it is extracted to (`..\\..\\x` would, where "\\" separates).
UNSAFE_IN_ZIP = re.compile(r"[\\:\x00-\x1f\x7f]")


def _zip_name(relative: str) -> str:
    return UNSAFE_IN_ZIP.sub("_", relative)


def _zip_chunks(session: _Session, folder: str, entries: list[tuple[str, int, int]]) -> Iterator[bytes]:
    sink = _Sink()
    with zipfile.ZipFile(sink, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for path, size, mtime in entries:
            info = zipfile.ZipInfo(
                _zip_name(posixpath.relpath(path, folder)),
                datetime.fromtimestamp(max(mtime, 315532800)).timetuple()[:6],
            )
            info.compress_type = zipfile.ZIP_DEFLATED
            with archive.open(info, "w", force_zip64=True) as member:
                for chunk in session.read(path, size):
                    member.write(chunk)
                    yield sink.take()
        yield sink.take()
    yield sink.take()
