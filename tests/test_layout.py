"""The tests' own layout (docs/testing.md): each test file sits in the folder of the behaviour it checks,
no test file imports another (what tests share lives in tests/helpers/ and tests/conftest.py), and the
folders are the ones docs/testing.md describes."""
from __future__ import annotations

import ast
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: One folder per behaviour; docs/testing.md says what goes in each.
BEHAVIOURS = ("reading", "segmentation", "patterns", "categories", "predictions", "comparison", "distributed",
              "reporters", "cli", "capture")
#: Test files allowed directly in tests/: this one, which checks the layout itself.
AT_THE_TOP = {"test_layout.py"}


def _test_files() -> list[Path]:
    return sorted(p for p in HERE.rglob("test_*.py") if "__pycache__" not in p.parts)


def _python_files() -> list[Path]:
    return sorted(p for p in HERE.rglob("*.py") if "__pycache__" not in p.parts)


def _imported(path: Path) -> set[str]:
    """The top-level names of every module ``path`` imports, at any depth of its code."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom):  # from . import x: a package of tests
            out.add("." * node.level + (node.module or ""))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args and isinstance(node.args[0], ast.Constant)):
            out.add(str(node.args[0].value).split(".")[0])
    return out


def test_every_test_file_sits_in_a_behaviour_folder():
    misplaced = [str(p.relative_to(HERE)) for p in _test_files()
                 if not (p.parent == HERE and p.name in AT_THE_TOP)
                 and not (p.parent.parent == HERE and p.parent.name in BEHAVIOURS)]
    assert not misplaced, f"move each into the folder of what it checks (docs/testing.md): {misplaced}"


def test_no_test_file_imports_another():
    tests = {p.stem for p in _test_files()} | {"conftest"}
    found = {str(p.relative_to(HERE)): sorted(m for m in _imported(p) if m in tests
                                              or (m.startswith(".") and p.stem in tests))
             for p in _python_files()}
    found = {k: v for k, v in found.items() if v}
    assert not found, f"share through tests/helpers/ or a conftest.py fixture instead: {found}"


def test_test_file_names_are_unique():
    """pytest imports a test file of a folder without __init__.py by its name alone: two of one name
    in two folders cannot both be collected."""
    seen: dict = {}
    for p in _test_files():
        seen.setdefault(p.name, []).append(str(p.relative_to(HERE)))
    assert not {k: v for k, v in seen.items() if len(v) > 1}


def test_the_folders_are_the_documented_ones():
    folders = sorted(p.name for p in HERE.iterdir() if p.is_dir() and p.name not in ("helpers", "__pycache__")
                     and not p.name.startswith("."))
    assert folders == sorted(BEHAVIOURS)
    text = (HERE.parent / "docs" / "testing.md").read_text()
    assert all(f"`tests/{name}/`" in text for name in BEHAVIOURS), "docs/testing.md describes every folder"


def _design_module_map() -> list[str]:
    """The module paths docs/design.md's "## Module map" lists, one ``- `path.py` — ...`` line each."""
    import re

    text = (HERE.parent / "docs" / "design.md").read_text()
    start = text.index("\n## Module map\n")
    end = text.find("\n## ", start + 1)
    section = text[start:end if end >= 0 else len(text)]
    return re.findall(r"^- `([\w/]+\.py)`", section, flags=re.M)


def test_design_md_names_every_module():
    """docs/design.md's module map names every .py module under phasemem/, once, and none that is gone."""
    package = HERE.parent / "phasemem"
    modules = {str(p.relative_to(package)) for p in package.rglob("*.py") if "__pycache__" not in p.parts}
    named = _design_module_map()
    repeated = sorted({m for m in named if named.count(m) > 1})
    missing = sorted(modules - set(named))
    gone = sorted(set(named) - modules)
    assert not missing, f"add a line for each to docs/design.md's module map: {missing}"
    assert not gone, f"docs/design.md's module map names modules that do not exist: {gone}"
    assert not repeated, f"named twice in docs/design.md's module map: {repeated}"
