"""The temporary swap directory of an optimizer given no swap_dir, and the sweep of those left by
processes that had no chance to remove theirs (kill -9, the OOM killer, a node's job killed
past its grace time).

Each such directory holds ``owner.lock``, flock(2)ed by the process that made it for as long as
it lives (the kernel lets go when it dies, however it dies), and is named after the host
(``tierswap-<host>-XXXXXXXX``). Before making one, an optimizer removes those of this host whose
lock it can take: their process has ended, and nothing could resume from them (resume needs a
swap_dir). A directory without the lock file (being made, or an older tierswap's) or of another
host (a TMPDIR shared over the network, where locks may be local to each node) is left alone.
"""

import fcntl
import os
import shutil
import socket
import tempfile
import warnings

from . import _tierswap

OWNER = "owner.lock"


def _prefix():
    return f"tierswap-{socket.gethostname() or 'localhost'}-"


def _hold(path):
    """Takes the directory's owner lock; returns its descriptor (None where the filesystem has no
    flock: the directory is then never swept, only removed by its own process)."""
    made = os.path.join(path, OWNER + ".new")
    fd = os.open(made, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:  # ENOLCK, EOPNOTSUPP: a filesystem without flock
        os.close(fd)
        os.unlink(made)
        return None
    os.write(fd, f"{os.getpid()}\n".encode())
    os.rename(made, os.path.join(path, OWNER))  # named only once locked: a sweep never sees it free
    return fd


def _bytes_in(path):
    total = 0
    for top, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(top, f)).st_blocks * 512
            except OSError:
                pass
    return total


def _stale(entry, prefix):
    """An open descriptor holding the owner lock of a directory of this host and user whose
    process has ended, or None."""
    if not entry.name.startswith(prefix):
        return None
    try:
        if not entry.is_dir(follow_symlinks=False) or \
                entry.stat(follow_symlinks=False).st_uid != os.getuid():
            return None
        fd = os.open(os.path.join(entry.path, OWNER), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held: its process (or a child it forked) still runs
        os.close(fd)
        return None
    return fd


def sweep(root):
    """Removes the temporary swap directories under `root` whose process has ended; warns with
    each one's path and size."""
    prefix = _prefix()
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    for entry in entries:
        fd = _stale(entry, prefix)
        if fd is None:
            continue
        try:
            size = _bytes_in(entry.path)
            shutil.rmtree(entry.path, ignore_errors=True)
        finally:
            os.close(fd)
        if not os.path.exists(entry.path):
            warnings.warn(f"removed {entry.path} ({size / 2**30:.2f} GiB): the temporary swap "
                          "directory of a tierswap optimizer whose process ended without removing "
                          "it (killed with SIGKILL, or by the OOM killer)", stacklevel=4)


class TempSwapDir:
    """The swap directory made for an optimizer given no swap_dir: removed at close(), when the
    constructor fails, by tierswap's handler when SIGTERM or SIGHUP ends the process (a job the
    scheduler stops must not leave its state's gigabytes behind; SIGINT is Python's
    KeyboardInterrupt, whose way out runs close()), and by the next optimizer on this host to
    make one when its process ended otherwise (above)."""

    def __init__(self):
        root = os.environ.get("TMPDIR") or "/var/tmp"
        sweep(root)
        self.path = tempfile.mkdtemp(prefix=_prefix(), dir=root)
        self._owner = None
        try:
            self._owner = _hold(self.path)
            self._handle = _tierswap.remove_on_signal(self.path)
        except BaseException:
            self._release()
            raise

    def _release(self):
        shutil.rmtree(self.path, ignore_errors=True)
        if self._owner is not None:
            os.close(self._owner)  # after the removal: never a moment unlocked while it exists
            self._owner = None

    def remove(self):
        _tierswap.forget_on_signal(self._handle)
        self._handle = -1
        self._release()
