"""A real broker process whose log.dir is a small filesystem of its own, for disk-full tests:
`python -m tests.faults.full_disk` takes the arguments of `python -m cli` and runs it in a
mount namespace of its own, where a tmpfs of PYMQ_DISK_BYTES bytes is mounted on the `log.dir`
given with `-o log.dir=...` (the directory must exist). Appends then fail with ENOSPC as on a
real full disk; no write of the broker is faked.

The mount exists for the broker process alone and goes with it. A test reaches the files on it
through /proc/<pid>/root/<log.dir> (to fill the filesystem, or free it). Needs CAP_SYS_ADMIN
(root) or unprivileged user namespaces; `available()` says whether this machine has either.
"""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000


def _unshare(flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        raise OSError(ctypes.get_errno(), f"unshare({flags:#x}) failed")


def enter_private_mounts() -> None:
    """Move this process into a mount namespace of its own, as root of a user namespace if it is
    not root, with mounts private so that nothing mounted here shows outside."""
    uid, gid = os.getuid(), os.getgid()
    if uid != 0:
        _unshare(CLONE_NEWUSER | CLONE_NEWNS)
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"0 {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"0 {gid} 1")
    else:
        _unshare(CLONE_NEWNS)
    subprocess.run(["mount", "--make-rprivate", "/"], check=True)


def mount_tmpfs(directory: str, size_bytes: int) -> None:
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", directory], check=True)


def available() -> bool:
    """Whether a child process can mount a tmpfs in a namespace of its own here."""
    probe = ("import tempfile, tests.faults.full_disk as f; d = tempfile.mkdtemp(); "
             "f.enter_private_mounts(); f.mount_tmpfs(d, 1 << 20)")
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=30).returncode == 0


def _log_dir(argv: list[str]) -> str:
    for value in argv:
        if value.startswith("log.dir="):
            return value.split("=", 1)[1]
    raise SystemExit("tests.faults.full_disk needs -o log.dir=...")


if __name__ == "__main__":
    log_dir = _log_dir(sys.argv[1:])
    enter_private_mounts()
    mount_tmpfs(log_dir, int(os.environ["PYMQ_DISK_BYTES"]))
    from cli import main

    sys.argv[0] = "pymq"
    main()
