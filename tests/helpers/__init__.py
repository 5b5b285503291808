"""What the tests share, imported by name (``from helpers.snapshots import heldout``); no test file
imports another (tests/test_layout.py). ``pythonpath = ["tests"]`` in pyproject.toml puts tests/ on
``sys.path``, so ``helpers`` is found from every folder (docs/testing.md).

- ``paths``: the repository, its fixtures and ../shared, and the snapshot files in them.
- ``snapshots``: a recording read as it was written, as a user hands it over, bare.
- ``analyses``: ``analyzed(path, form, **options)``, each analysis made once a session.
- ``reference``: a naive per-event replay sharing no code with phasemem.
- ``pattern_truth``: which shapes a trace holds, from markers, dimensions and frames.
- ``frameless``: a marked trace's truth and its reading from lifetimes alone.
- ``traces``: two Traces compared field by field.
- ``wild``: ../shared/wild and what each program did; ``modules``: whether torch (or another) is there.
"""
