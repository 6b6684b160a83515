"""Shifts every uid/gid of a root filesystem by an offset, for an unprivileged container's idmap.

    python3 shift_ids.py ROOTFS OFFSET

Idempotent: ids already at or above OFFSET are left alone. chown clears setuid/setgid bits,
so they are restored afterwards.
"""

import os
import stat
import sys


def shift(path: str, offset: int) -> None:
    st = os.lstat(path)
    uid = st.st_uid if st.st_uid >= offset else st.st_uid + offset
    gid = st.st_gid if st.st_gid >= offset else st.st_gid + offset
    if (uid, gid) == (st.st_uid, st.st_gid):
        return
    os.lchown(path, uid, gid)
    if not stat.S_ISLNK(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
        os.chmod(path, stat.S_IMODE(st.st_mode))


def main() -> None:
    root, offset = sys.argv[1], int(sys.argv[2])
    count = 0
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            shift(os.path.join(directory, name), offset)
            count += 1
    shift(root, offset)
    print(f"  shifted {count} paths by {offset}")


if __name__ == "__main__":
    main()
