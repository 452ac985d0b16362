"""Every tutorial notebook as a person sees it: JupyterLab in headless Chromium, 1280 px wide.

The notebooks are opened with their saved outputs (nothing is executed, no kernel is started),
every cell is rendered (the notebook's windowing is switched off), and each notebook is
screenshotted whole into a folder a person can look at: ``build/tutorial-screenshots/`` in the
repository, or ``$HANDLERKIT_SCREENSHOTS``. Then, per notebook and cell, what the page shows is
checked:

- no output is wider than its output area (a scroll bar, or a picture JupyterLab shrank to fit:
  its text then becomes tiny), and no line of a text table wraps (a line with column gaps of
  two spaces or more: wrapped, its columns fall apart into fragments; prose may wrap);
- no table cell of prose is right-aligned (its computed style), as JupyterLab's own stylesheet
  does to a bare ``<table>``;
- no picture is blank (98 % or more of its pixels one colour).

One failure lists every offender. Same needs and skip rule as ``test_browser.py`` (marker
``browser``; ``HANDLERKIT_REQUIRE_BROWSER=1`` makes a missing browser a failure).

The helpers (``lab_with_notebooks``, ``open_notebook``, ``full_length``, ``screenshot``,
``cell_box``) also serve ``docs/screenshots/shoot.py``, which crops single cells for the docs.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from integration.test_browser import _chrome, _jupyter_lab, _require_browser, _wait

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
SCREENSHOTS = Path(os.environ.get("HANDLERKIT_SCREENSHOTS") or ROOT / "build" / "tutorial-screenshots")
DEADLINE_S = 240  # the whole test: one server, one browser, every notebook
WIDTH = 1280  # a laptop's browser window
SHRUNK = 1.05  # a picture drawn wider than this times its shown width counts as overflowing
BLANK = 0.98  # share of one colour that makes a picture blank

# Every cell in the DOM (JupyterLab 4 otherwise attaches or paints only the cells in view), no
# "show more outputs" cut, no empty screen after the last cell.
SETTINGS = {"notebook-extension/tracker": {"windowingMode": "none", "maxNumberOutputs": 10_000, "scrollPastEnd": False}}

# Opens a notebook without starting its kernel: nothing is run, its saved outputs are the page.
OPEN = """
const [path, done] = [arguments[0], arguments[arguments.length - 1]];
const app = window.jupyterapp;
const factory = app.docRegistry.getWidgetFactory('Notebook');
factory._preferKernel = false;
factory._canStartKernel = false;
// The last notebook goes without a "save changes?" dialog (JupyterLab may mark one it normalised as changed).
for (const widget of [...app.shell.widgets('main')]) widget.dispose();
app.commands.execute('docmanager:open', {path, factory: 'Notebook'})
  .then(() => done(null), (e) => done(String(e)));
"""

# True once the notebook is shown with every cell in the DOM and every picture decoded.
RENDERED = """
const panel = window.jupyterapp.shell.currentWidget;
if (!panel || !panel.content || panel.context.path !== arguments[0] || !panel.context.isReady) return false;
const cells = panel.content.widgets;
if (!cells.length || cells.some((c) => !c.node.isConnected)) return false;
const images = [...panel.content.node.querySelectorAll('.jp-OutputArea-output img')];
return images.every((img) => img.complete && img.naturalWidth > 0) && !!panel.content.node.querySelector('.jp-Cell');
"""

# What each cell's outputs look like on the page, measured: overflowing areas, shrunk pictures,
# wrapped lines, right-aligned prose in tables; and every picture's data for the blank check.
MEASURE = r"""
const panel = window.jupyterapp.shell.currentWidget;
const value = String.raw`[-+−]?(\d[\d,  ]*)?\.?\d+([eE][-+]?\d+)?\s*(%|[µu]?s|ms|ns|min|h|[kKMGT]?i?B|x|×|px|fps|/s)?`;
// A number, with its unit, or two (a range, a ratio, a spread): right-aligned as numbers should be.
const number = new RegExp(`^${value}(\\s*[-–/±]\\s*${value})?$`);
const found = [];
panel.content.widgets.forEach((cell, index) => {
  cell.node.querySelectorAll('.jp-OutputArea-output').forEach((area) => {
    const width = area.clientWidth;
    if (area.scrollWidth > width + 1) {
      found.push({index, kind: 'overflow', detail: `an output ${area.scrollWidth} px wide in an area of ${width} px`});
    }
    area.querySelectorAll('img').forEach((img) => {
      const shown = img.getBoundingClientRect().width;
      if (img.naturalWidth > shown * arguments[0]) {
        found.push({index, kind: 'overflow', detail:
          `a picture ${img.naturalWidth} px wide shown at ${Math.round(100 * shown / img.naturalWidth)} % (${Math.round(shown)} px)`});
      }
      found.push({index, kind: 'image', src: img.src});
    });
    area.querySelectorAll('pre').forEach((pre) => {
      const style = getComputedStyle(pre);
      const probe = document.createElement('span');
      probe.style.font = style.font;
      probe.style.whiteSpace = 'pre';
      probe.style.visibility = 'hidden';
      probe.style.position = 'absolute';
      probe.textContent = 'x'.repeat(100);
      document.body.appendChild(probe);
      const column = probe.getBoundingClientRect().width / 100;
      probe.remove();
      const columns = Math.floor(pre.clientWidth / column);
      const lines = pre.textContent.split('\n');
      const longest = Math.max(...lines.map((line) => line.length));
      // A table's line (two or more gaps of 2+ spaces between columns) must not wrap; prose may.
      const tabular = (line) => (line.trim().match(/\S {2,}(?=\S)/g) || []).length >= 2;
      const wrapped = lines.filter((line) => line.length > columns && tabular(line));
      if (wrapped.length) {
        const example = wrapped[0].trim().slice(0, 40);
        found.push({index, kind: 'overflow', detail: `${wrapped.length} line(s) of a text table up to ${longest} columns ` +
          `wrap in an area of ${columns} columns, e.g. "${example}…"`});
      }
    });
    const prose = [];
    area.querySelectorAll('td, tbody th').forEach((td) => {
      const text = td.innerText.trim();
      if (!text || number.test(text) || /^[-–—…]$/.test(text)) return;
      const align = getComputedStyle(td).textAlign;
      if (align === 'right' || align === 'end') prose.push(text.replace(/\s+/g, ' '));
    });
    if (prose.length) {
      const example = prose[0].length > 40 ? prose[0].slice(0, 39) + '…' : prose[0];
      found.push({index, kind: 'right-aligned', detail: `${prose.length} table cell(s) of text, e.g. "${example}"`});
    }
  });
});
return found;
"""


def notebooks() -> list[str]:
    """The tutorial notebooks' file names, in order."""
    return sorted(path.name for path in NOTEBOOKS.glob("*.ipynb"))


@contextlib.contextmanager
def lab_with_notebooks(tmp: Path, deadline: float) -> Iterator[tuple[str, object]]:
    """One JupyterLab serving a copy of ``notebooks/`` (so nothing in the repository is touched)
    and one headless Chromium ``WIDTH`` px wide on it; yields ``(url, driver)``."""
    with _jupyter_lab(tmp, deadline, source="") as url:
        for name in notebooks():
            shutil.copy(NOTEBOOKS / name, tmp / "root" / name)
            trust(tmp, tmp / "root" / name)
        # The server reads user settings on every request, so these count from the page's load on.
        settings = tmp / "jupyter_config_dir" / "lab" / "user-settings" / "@jupyterlab"
        for plugin, values in SETTINGS.items():
            path = settings / f"{plugin}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        driver = _chrome(tmp, deadline)
        try:
            driver.set_window_size(WIDTH, 1000)
            driver.get(f"{url}/lab")
            _wait(driver, lambda d: d.execute_script("return !!window.jupyterapp"), "JupyterLab", deadline)
            # Once its layout is restored, the side panels are folded: the notebook has the window's width.
            driver.execute_async_script(
                "const [app, done] = [window.jupyterapp, arguments[0]];"
                "app.restored.then(() => { app.shell.collapseLeft(); app.shell.collapseRight(); done(); });"
            )
            yield url, driver
        finally:
            driver.quit()


def trust(tmp: Path, path: Path) -> None:
    """Trust the notebook at ``path`` in the server ``lab_with_notebooks(tmp)`` started, as a
    notebook its user ran is trusted: JupyterLab strips an untrusted one's ``<style>``."""
    import nbformat
    from nbformat.sign import NotebookNotary

    NotebookNotary(data_dir=str(tmp / "jupyter_data_dir")).sign(nbformat.read(path, as_version=4))


def open_notebook(driver, name: str, deadline: float) -> None:
    """Show notebook ``name`` (no kernel) with every cell rendered."""
    error = driver.execute_async_script(OPEN, name)
    assert error is None, f"JupyterLab could not open {name}: {error}"
    _wait(driver, lambda d: d.execute_script(RENDERED, name), f"{name} with every cell rendered", deadline)
    _settle(driver, deadline)


def _settle(driver, deadline: float) -> None:
    """Wait until the notebook's height stops changing (markdown, fonts and pictures laid out)."""
    script = "return window.jupyterapp.shell.currentWidget.content.node.querySelector('.jp-WindowedPanel-outer').scrollHeight"
    last, steady = -1, 0
    while steady < 3 and time.monotonic() < deadline:
        height = driver.execute_script(script)
        steady = steady + 1 if height == last else 0
        last = height
        time.sleep(0.1)


LAID_OUT = """
const outer = window.jupyterapp.shell.currentWidget.content.node.querySelector('.jp-WindowedPanel-outer');
return outer.clientHeight >= outer.scrollHeight;
"""


@contextlib.contextmanager
def full_length(driver) -> Iterator[None]:
    """The window made as tall as the open notebook, so that every cell is on one screen."""
    height = driver.execute_script(
        "const outer = window.jupyterapp.shell.currentWidget.content.node.querySelector('.jp-WindowedPanel-outer');"
        "return outer.getBoundingClientRect().top + outer.scrollHeight + 40;"  # + the status bar
    )
    metrics = {"width": WIDTH, "height": int(height), "deviceScaleFactor": 1, "mobile": False}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    try:
        # JupyterLab lays itself out again on the resize, in an animation frame: wait for the notebook's full length.
        until = time.monotonic() + 10
        while time.monotonic() < until and not driver.execute_script(LAID_OUT):
            time.sleep(0.05)
        yield
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def screenshot(driver) -> bytes:
    """The window as a PNG (all of it: ``get_screenshot_as_png`` stops at the first screen)."""
    return base64.b64decode(driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png"})["data"])


def cell_box(driver, index: int) -> tuple[int, int, int, int]:
    """Cell ``index``'s box in the window, (left, top, right, bottom) in pixels."""
    rect = driver.execute_script(
        "const r = window.jupyterapp.shell.currentWidget.content.widgets[arguments[0]].node.getBoundingClientRect();"
        "return [r.left, r.top, r.right, r.bottom];",
        index,
    )
    return tuple(round(value) for value in rect)


def blank_share(src: str) -> float | None:
    """The share of a picture's pixels that have its commonest colour (None: not a data URL PIL reads)."""
    from PIL import Image, UnidentifiedImageError

    if not src.startswith("data:image/") or ";base64," not in src:
        return None
    try:
        image = Image.open(io.BytesIO(base64.b64decode(src.split(";base64,", 1)[1]))).convert("RGBA")
    except (UnidentifiedImageError, ValueError):
        return None
    total = image.width * image.height
    colours = image.getcolors(maxcolors=total) or [(0, None)]
    return max(count for count, _ in colours) / total


SOURCES = """
return window.jupyterapp.shell.currentWidget.content.widgets.map((cell) =>
  cell.model.sharedModel.getSource().split('\\n').find((line) => line.trim() && !line.startsWith('# NBVAL')) || '');
"""


def problems(driver) -> list[str]:
    """What is wrong with the open notebook, one line per cell and kind, each cell named by its
    index and its first line of source."""
    sources = driver.execute_script(SOURCES)
    lines = []
    for found in driver.execute_script(MEASURE, SHRUNK):
        source = sources[found["index"]].strip()
        cell = f"cell {found['index']} ({source[:29] + '…' if len(source) > 30 else source})"
        if found["kind"] == "image":
            share = blank_share(found["src"])
            if share is not None and share >= BLANK:
                lines.append(f"{cell}: blank picture: {100 * share:.1f} % of its pixels are one colour")
        else:
            lines.append(f"{cell}: {found['kind']}: {found['detail']}")
    return list(dict.fromkeys(lines))


def _png(image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def _planted_notebook(path: Path) -> None:
    """A notebook with one of each problem the test looks for, and a cell of each done right."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output
    from PIL import Image

    def cell(*outputs):
        return new_code_cell("x", outputs=list(outputs))

    def shown(data):
        return new_output("display_data", data={**data, "text/plain": "x"})

    gradient = Image.linear_gradient("L").resize((600, 100)).convert("RGB")
    # JupyterLab's own rule, :not(.jp-RenderedMarkdown).jp-RenderedHTMLCommon td, weighs (0, 2, 1).
    scoped = "<style>.jp-RenderedHTMLCommon table.ok td { text-align: left; }</style>"
    numbers = "".join(f"<td>{n}</td>" for n in ("12.5 ms", "3,072", "0.143-0.224", "4.5 KiB", "1/0", "—"))
    table = "<table class='ok'><tr><td>{}</td>" + numbers + "</tr></table>"
    nb = new_notebook(
        cells=[
            new_markdown_cell("# planted"),
            cell(shown({"image/png": _png(gradient.resize((2000, 100)))})),  # 1: shrunk to fit
            cell(shown({"image/png": _png(Image.new("RGB", (300, 100), "white"))})),  # 2: blank
            cell(shown({"text/html": table.replace(" class='ok'", "").format("a fix in words")})),  # 3: flush right
            cell(shown({"text/html": "<div style='width: 2000px'>wide</div>"})),  # 4: a scroll bar
            cell(new_output("stream", name="stdout", text="a table  line  " * 24 + "\n" + "prose " * 60 + "\n")),  # 5
            cell(shown({"image/png": _png(gradient)}), shown({"text/html": scoped + table.format("a fix in words")})),
        ]
    )
    nbformat.write(nb, path)


PLANTED = [
    r"cell 1 \(x\): overflow: a picture 2000 px wide shown at \d+ % \(\d+ px\)",
    r"cell 2 \(x\): blank picture: 100.0 % of its pixels are one colour",
    r'cell 3 \(x\): right-aligned: 1 table cell\(s\) of text, e.g. "a fix in words"',
    r"cell 4 \(x\): overflow: an output 20\d\d px wide in an area of \d+ px",
    r'cell 5 \(x\): overflow: 1 line\(s\) of a text table up to 360 columns wrap in an area of \d+ columns, e.g. "a table  line  a table  line  a table  l…"',
]


def test_every_tutorial_reads_well_in_jupyterlab(tmp_path):
    """Every tutorial at 1280 px: no output wider than its area, no prose flush right, no blank
    picture. First a planted notebook proves each check finds what it looks for."""
    _require_browser()
    import re

    started = time.monotonic()
    deadline = started + DEADLINE_S
    report: dict[str, list[str]] = {}
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with lab_with_notebooks(tmp_path, deadline) as (_url, driver):
        _planted_notebook(tmp_path / "root" / "planted.ipynb")
        trust(tmp_path, tmp_path / "root" / "planted.ipynb")
        open_notebook(driver, "planted.ipynb", deadline)
        planted = problems(driver)
        assert len(planted) == len(PLANTED) and all(map(re.fullmatch, PLANTED, planted)), (
            "the checks must find exactly the planted problems; they found:\n" + "\n".join(planted)
        )
        for name in notebooks():
            open_notebook(driver, name, deadline)
            report[name] = problems(driver)  # in a window 1280 px wide, the notebook scrolled, as people see it
            with full_length(driver):
                (SCREENSHOTS / f"{Path(name).stem}.png").write_bytes(screenshot(driver))
    print(f"screenshots of {len(report)} notebooks in {SCREENSHOTS} ({time.monotonic() - started:.0f} s)")
    offenders = {name: lines for name, lines in report.items() if lines}
    if offenders:
        pytest.fail(
            f"{sum(map(len, offenders.values()))} problem(s) in the tutorials in JupyterLab at {WIDTH} px "
            f"(cells counted from 0; screenshots in {SCREENSHOTS}):\n"
            + "\n".join(f"{name}:\n" + "\n".join(f"  {line}" for line in lines) for name, lines in offenders.items()),
            pytrace=False,
        )
