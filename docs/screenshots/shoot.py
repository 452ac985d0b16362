"""Screenshots of single notebook cells as JupyterLab shows them (headless Chromium, 1280 px wide).

The tutorial notebooks are opened with their saved outputs (nothing is run, no kernel starts) and
each cell asked for is cropped from the page into ``FOLDER/<notebook>-cell<index>.png``; a
cell's index counts from 0 over all the notebook's cells, as nbformat does.

    python docs/screenshots/shoot.py docs/screenshots/before 03:22,28 04:9 10:9 06:11 05:10 11:7

A notebook is named by the start of its file name (``03`` for ``03_debugging.ipynb``). Needs
what the browser tests need: Debian's ``chromium`` and ``chromium-driver``, and ``jupyterlab``
and ``selenium`` from the ``[test]`` extra. Run it from the repository root with the project's
environment (``.venv/bin/python``).
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from integration.test_browser import _missing  # noqa: E402
from integration.test_tutorials_in_browser import cell_box, full_length, lab_with_notebooks, notebooks, open_notebook, screenshot  # noqa: E402

DEADLINE_S = 300


def _parse(spec: str) -> tuple[str, list[int]]:
    """``"03:22,24"`` -> ``("03_debugging.ipynb", [22, 24])``."""
    prefix, _, cells = spec.partition(":")
    names = [name for name in notebooks() if name.startswith(prefix)]
    if len(names) != 1:
        raise SystemExit(f"{spec!r}: {prefix!r} names {len(names)} notebooks ({', '.join(names) or 'none'}); want one")
    try:
        return names[0], [int(cell) for cell in cells.split(",")]
    except ValueError:
        raise SystemExit(f"{spec!r}: want NOTEBOOK:CELL[,CELL...] with cell indices counted from 0") from None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="where the PNGs go (made if missing)")
    parser.add_argument("cells", nargs="+", metavar="NOTEBOOK:CELL[,CELL...]", help="e.g. 03:22,24 04:9")
    args = parser.parse_args(argv)
    wanted = [_parse(spec) for spec in args.cells]
    if (reason := _missing()) is not None:
        raise SystemExit(f"cannot open a browser here: {reason}")

    from PIL import Image

    args.folder.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + DEADLINE_S
    with (
        tempfile.TemporaryDirectory(prefix="handlerkit-shoot-") as tmp,
        lab_with_notebooks(Path(tmp), deadline) as (_url, driver),
    ):
        for name, cells in wanted:
            open_notebook(driver, name, deadline)
            with full_length(driver):
                page = Image.open(io.BytesIO(screenshot(driver)))
                for index in cells:
                    path = args.folder / f"{Path(name).stem}-cell{index}.png"
                    page.crop(cell_box(driver, index)).save(path, optimize=True)
                    print(path)


if __name__ == "__main__":
    main()
