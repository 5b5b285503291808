"""Write files atomically: a reader sees the old file or the new one, never half of either."""
from __future__ import annotations

import os
import tempfile
from typing import Callable

from .errors import PhasememError

#: Pictures smaller than this cannot hold the strip, the curve and the legends legibly (a 100x100
#: picture was accepted and unreadable); the CLI and render.plot check the same numbers.
MIN_PICTURE = (480, 270)
MAX_PICTURE = 20000
PICTURE_SIZES = (f"the picture must be at least {MIN_PICTURE[0]}x{MIN_PICTURE[1]} and at most "
                 f"{MAX_PICTURE}x{MAX_PICTURE} pixels")


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)``, then move the result over ``path``; on failure ``path`` is untouched."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise PhasememError(f"{path}: the folder {folder} does not exist; create it or choose another output path")
    fd, tmp = tempfile.mkstemp(prefix=".phasemem-", suffix=os.path.splitext(path)[1], dir=folder)
    os.close(fd)
    try:
        write(tmp)
        # mkstemp makes the file private; give the output the mode any new file would get
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except OSError as e:
        raise PhasememError(f"{path}: cannot be written ({e.strerror or e})") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
