"""handlerkit.archive.imports: which modules of a model dir its Python files import, found by reading
their source (nothing is imported or run), transitively, resolved only inside the dir.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from handlerkit.archive.imports import imported_names, local_imports, resolve


def test_the_import_scan_reads_every_form_and_resolves_only_in_the_dir(tmp_path: Path) -> None:
    source = (
        "import os, json.decoder\nimport a.b as ab\nfrom c import d\nfrom .e import f\nfrom . import g\n\n\n"
        "def later(name):\n    import h\n    importlib.import_module('i.j')\n    __import__('k')\n"
        "    importlib.import_module('.rel', 'pkg')\n    import_module(name)\n"
    )
    assert imported_names(source) == {"os", "json", "a", "c", "h", "i", "k"}
    (tmp_path / "a.py").write_text("")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "d.py").write_text("")  # a namespace package
    (tmp_path / "h").mkdir()
    (tmp_path / "h" / "table.csv").write_text("")  # a data folder, no package
    (tmp_path / "k.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    assert resolve(tmp_path, "a") == tmp_path / "a.py" and resolve(tmp_path, "c") == tmp_path / "c"
    assert resolve(tmp_path, "k") == tmp_path / "k.cpython-311-x86_64-linux-gnu.so"
    assert resolve(tmp_path, "h") is None and resolve(tmp_path, "os") is None
    (tmp_path / "start.py").write_text(source)
    (tmp_path / "c" / "d.py").write_text("import broken\n")
    (tmp_path / "broken.py").write_text("def oops(:\n")
    found, notes = local_imports(tmp_path, [("start.py", tmp_path / "start.py")])
    assert found == {tmp_path / "a.py": "start.py", tmp_path / "c": "start.py",
                     tmp_path / "k.cpython-311-x86_64-linux-gnu.so": "start.py", tmp_path / "broken.py": "c/d.py"}  # fmt: skip
    assert notes == ["broken.py was not scanned for local imports: SyntaxError (line 1)"]


def test_imports_are_followed_through_each_other_once_and_packages_are_read_whole(tmp_path: Path) -> None:
    files = {
        "a.py": "import b\n",
        "b.py": "import a\nimport pkg.sub\n",  # a loop back to the start
        "pkg/__init__.py": "from . import sub\n",
        "pkg/sub.py": "import c\n",
        "pkg/.hidden/x.py": "import d\n",  # not a module of the package: not read
        "pkg/__pycache__/y.py": "import e\n",
        "c.py": "",
        "d.py": "",
        "e.py": "",
        "readme.md": "import d\n",  # not Python: not a place to start
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found, notes = local_imports(tmp_path, [("a.py", tmp_path / "a.py"), ("readme.md", tmp_path / "readme.md")])
    assert found == {tmp_path / "b.py": "a.py", tmp_path / "a.py": "b.py", tmp_path / "pkg": "b.py",
                     tmp_path / "c.py": "pkg/sub.py"}  # fmt: skip
    assert notes == []


def test_a_file_that_cannot_be_read_as_python_gets_a_note_and_is_not_followed(tmp_path: Path) -> None:
    (tmp_path / "start.py").write_text("import latin\n")
    (tmp_path / "latin.py").write_bytes("import d  # caf\xe9\n".encode("latin-1"))
    (tmp_path / "d.py").write_text("")
    found, notes = local_imports(tmp_path, [("start.py", tmp_path / "start.py")])
    assert found == {tmp_path / "latin.py": "start.py"}
    assert notes == ["latin.py was not scanned for local imports: UnicodeDecodeError"]
    with pytest.raises(SyntaxError, match=r"x\.py, line 1"):
        imported_names("def (:", "x.py")
