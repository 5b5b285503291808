"""Write files atomically: a reader sees the old file or the new one, never half of either; and a
command that writes several files writes all of them or none."""
from __future__ import annotations

import os
import tempfile
from typing import Callable, Iterable

from .errors import PhasememError

#: Pictures smaller than this cannot hold the strip, the curve and the legends legibly (a 100x100
#: picture was accepted and unreadable); the CLI and the picture check the same numbers.
MIN_PICTURE = (480, 270)
MAX_PICTURE = 20000
PICTURE_SIZES = (f"the picture must be at least {MIN_PICTURE[0]}x{MIN_PICTURE[1]} and at most "
                 f"{MAX_PICTURE}x{MAX_PICTURE} pixels")

Writer = Callable[[str], None]


def check_picture_size(size, dpi) -> tuple[int, int]:
    """(width, height) in pixels if ``size`` and ``dpi`` make a legible picture, else ValueError."""
    try:
        w, h = (int(v) for v in size)
    except (TypeError, ValueError):
        raise ValueError(f"size={size!r}: give (width, height) in pixels") from None
    if not (MIN_PICTURE[0] <= w <= MAX_PICTURE and MIN_PICTURE[1] <= h <= MAX_PICTURE):
        raise ValueError(f"size={size!r}: {PICTURE_SIZES}")
    if not 10 <= dpi <= 2000:
        raise ValueError(f"dpi={dpi!r}: use 10 to 2000")
    return w, h


def atomic_write(path: str | os.PathLike, write: Writer) -> None:
    """Call ``write(tmp_path)``, then move the result over ``path``; on failure ``path`` is untouched."""
    write_all([(path, write)])


def write_all(outputs: Iterable[tuple[str | os.PathLike, Writer]]) -> None:
    """Write every output to a temporary file beside it, and only when all of them are written move
    them into place: a failure (an unwritable folder, a full disk, a bad format) leaves every path as it
    was and no temporary file behind, and is one PhasememError line.

    Example:
        >>> write_all([("memory.png", draw), ("memory.json", dump)])
    """
    done: list[tuple[str, str]] = []
    try:
        for path, write in outputs:
            path = os.fspath(path)
            done.append((_temporary(path), path))
            write(done[-1][0])
        umask = os.umask(0)
        os.umask(umask)
        for tmp, path in done:
            # mkstemp makes the file private; give the output the mode any new file would get
            os.chmod(tmp, 0o666 & ~umask)
        for tmp, path in done:
            os.replace(tmp, path)
    except OSError as e:
        where = done[-1][1] if done else "output"
        raise PhasememError(f"{where}: cannot be written ({e.strerror or e}); choose another output path") from None
    finally:
        for tmp, _ in done:
            if os.path.exists(tmp):
                os.unlink(tmp)


def _temporary(path: str) -> str:
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise PhasememError(f"{path}: the folder {folder} does not exist; create it or choose another output path")
    if os.path.isdir(path):
        raise PhasememError(f"{path}: is a directory; give a file name")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".phasemem-", suffix=os.path.splitext(path)[1], dir=folder)
    except OSError as e:
        raise PhasememError(f"{path}: cannot be written in {folder} ({e.strerror or e}); "
                            f"choose another output path") from None
    os.close(fd)
    return tmp
