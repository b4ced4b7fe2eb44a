"""Linux inotify through ctypes: tells the tee which log files a worker just wrote.

The stdlib has no inotify binding and the agent takes no dependencies; libc's three calls are
all it needs. ``Inotify()`` raises ``OSError`` where inotify is missing (not Linux, or the
user's ``max_user_instances`` is spent); the tee then polls the files instead.
"""

from __future__ import annotations

import os
import struct

IN_MODIFY = 0x00000002
IN_Q_OVERFLOW = 0x00004000
# struct inotify_event: wd, mask, cookie, len, then ``len`` bytes of name (none for a file).
_EVENT = struct.Struct("iIII")


class Inotify:
    """One non-blocking, close-on-exec inotify fd watching files for writes."""

    def __init__(self) -> None:
        try:
            import ctypes  # no benchmark: here so that a Python without ctypes still runs
        except ImportError as exc:  # a Python built without ctypes
            raise OSError(f"inotify needs ctypes: {exc}") from exc
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            init, add = libc.inotify_init1, libc.inotify_add_watch
        except (OSError, AttributeError) as exc:  # not Linux/glibc
            raise OSError(f"no inotify in this libc: {exc}") from exc
        add.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
        self._ctypes = ctypes
        self._add = add
        fd = init(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")
        self.fd: int = fd

    def watch(self, path: str) -> int:
        """Watch ``path`` for writes; the watch descriptor that ``read`` reports."""
        wd: int = self._add(self.fd, os.fsencode(path), IN_MODIFY)
        if wd < 0:
            err = self._ctypes.get_errno()
            raise OSError(err, f"inotify_add_watch {path}: {os.strerror(err)}")
        return wd

    def read(self) -> set[int] | None:
        """The watch descriptors with writes since the last call (empty: none yet); None when
        the kernel's queue overflowed and any file may have changed."""
        changed: set[int] = set()
        while True:
            try:
                buf = os.read(self.fd, 64 << 10)
            except BlockingIOError:
                return changed
            off = 0
            while off < len(buf):
                wd, mask, _cookie, name_len = _EVENT.unpack_from(buf, off)
                if mask & IN_Q_OVERFLOW:
                    return None
                changed.add(wd)
                off += _EVENT.size + name_len

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
