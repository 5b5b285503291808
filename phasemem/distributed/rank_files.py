"""Which files hold a run's ranks: a folder ``run.save`` wrote, a glob or a list, in rank order."""
from __future__ import annotations

import glob
import os
import re

from ..errors import PhasememError

#: The files a folder's snapshots end with.
SNAPSHOT_SUFFIXES = (".pickle", ".pkl", ".pickle.xz", ".pkl.xz", ".pickle.gz", ".pkl.gz", ".npz")
#: In a folder, an out-of-memory dump beside the rank's recording (``oom_rank<r>.pickle.xz``, what the
#: trainer callbacks write, phasemem/integrations) is another recording of that rank: left out.
OOM_PREFIX = "oom_"
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.I)


def rank_files(sources) -> list[str]:
    """The snapshot files of ``sources``: a folder (its snapshots), a glob, a file, or a list of them,
    ordered by the rank number in their names.

    Example:
        >>> rank_files("mem/")
        ['mem/rank0.pickle.xz', 'mem/rank1.pickle.xz']
    """
    items = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    found: list[str] = []
    for item in (os.fspath(s) for s in items):
        if os.path.isdir(item):
            inside = [os.path.join(item, f) for f in os.listdir(item)
                      if f.lower().endswith(SNAPSHOT_SUFFIXES) and not f.startswith(OOM_PREFIX)]
            if not inside:
                raise PhasememError(f"{item}: no snapshot in this folder (files ending "
                                    f"{', '.join(SNAPSHOT_SUFFIXES)}); run.save(folder) writes rank<r>.pickle.xz")
            found += inside
        elif os.path.exists(item):
            found.append(item)
        elif glob.has_magic(item) and glob.glob(item):
            found += [f for f in glob.glob(item) if os.path.isfile(f)]
        else:
            raise PhasememError(f"{item}: no such file, folder or matching files; give the folder run.save wrote")
    unique = list(dict.fromkeys(found))
    return sorted(unique, key=lambda f: (rank_of_name(f) is None, rank_of_name(f) or 0, f))


def rank_of_name(path: str) -> int | None:
    """The rank number a file's name carries (``rank3.pickle.xz``, ``mem.rank3.pkl.xz``), or None."""
    m = _RANK_IN_NAME.search(os.path.basename(path))
    return int(m.group(1)) if m else None
