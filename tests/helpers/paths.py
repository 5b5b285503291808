"""Where the repository's recordings and ../shared lie; nothing is read here."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures"
#: ../shared beside the checkout: never committed; the tests that read it skip where it is absent.
SHARED_ROOT = ROOT.parent / "shared"
SHARED = SHARED_ROOT / "gpu-snapshots"
WILD = SHARED_ROOT / "wild"


def shared_paths() -> list[Path]:
    return sorted(SHARED.glob("*.pkl.xz"))


def fixture_paths() -> list[Path]:
    return sorted(FIXTURES.glob("*.pkl.xz"))


def heldout_path(name: str) -> Path:
    """fixtures/heldoutN/<name>.pkl.xz of a held-out recording named hN_...: ``h9_ppo`` is in heldout9."""
    m = re.match(r"h(\d+)_", name)
    if not m:
        raise ValueError(f"{name!r} names no held-out set (hN_...)")
    return FIXTURES / f"heldout{m.group(1)}" / f"{name}.pkl.xz"


def path_id(p: Path) -> str:
    """A test id for a recording: its folder and name (``heldout9/h9_ppo``)."""
    return f"{p.parent.name}/{p.name.split('.')[0]}"
