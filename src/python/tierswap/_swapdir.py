"""The temporary swap directory of an optimizer given no swap_dir (detail::OwnedTempDir, in
include/tierswap/detail/temp_dir.hpp): ``<root>/tierswap-<host>-`` and six random characters,
beside a lock file its process holds while it lives. Removed at close(), when the constructor
fails, by tierswap's handler when SIGTERM or SIGHUP ends the process (a job the scheduler stops
must not leave its state's gigabytes behind; SIGINT is Python's KeyboardInterrupt, whose way
out runs close()), and, when the process was killed outright (SIGKILL, the OOM killer, a job
killed past its grace time), by the next optimizer on this host to make one, with a warning
naming it. Nothing could resume from such a directory (resume needs a swap_dir)."""

import warnings

from . import _tierswap


class TempSwapDir:
    def __init__(self):
        root = _tierswap.default_temp_root()
        try:
            self._dir, swept = _tierswap.make_temp_dir(root, "tierswap")
        except RuntimeError as e:
            raise RuntimeError(f"no swap_dir given, and no temporary swap directory could be made "
                               f"under {root} (TMPDIR, else /var/tmp): {e}. Give swap_dir, or "
                               "set TMPDIR to a directory on a real disk") from None
        for path, size in swept:
            warnings.warn(f"removed {path} ({size / 2**30:.2f} GiB): the temporary swap directory "
                          "of a tierswap optimizer whose process ended without removing it "
                          "(killed with SIGKILL, or by the OOM killer)", stacklevel=4)
        self.path = self._dir.path

    def remove(self):
        self._dir.remove()
