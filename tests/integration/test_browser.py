"""The Stepper in a real browser (over a Harness, and over hk.Sequences): JupyterLab, headless
Chromium driven by Selenium.

The Python tests (widgets/test_stepper.py) prove what the buttons do to the harness; only a browser
proves the widget reaches the page: the notebook runs in a real kernel, the preprocess button
is clicked like a person would, and its pane's text appears in the page.

Needs Debian's ``chromium`` and ``chromium-driver`` (a version-matched pair; no browser can be
downloaded here) plus ``jupyterlab`` and ``selenium`` from the ``[test]`` extra. Where the
browser is missing the test skips with the reason, except when ``HANDLERKIT_REQUIRE_BROWSER=1``
(CI's ``.ci/run`` sets it after installing Chromium), where that is a failure.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
MODEL_DIR = ROOT / "fixtures" / "models" / "image_classifier"
IMAGE = ROOT / "fixtures" / "images" / "circle.png"
DEADLINE_S = 120  # the whole test: server, browser, kernel, click, text
CHROME_FLAGS = ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000")


def _missing() -> str | None:
    """Why the browser test cannot run here, or None."""
    for module, extra in (("selenium", "selenium"), ("jupyterlab", "jupyterlab")):
        if importlib.util.find_spec(module) is None:
            return f"needs {extra}: pip install 'handlerkit[test]'"
    if _chromium() is None:
        return "needs Chromium: apt-get install chromium"
    if _chromedriver() is None:
        return "needs chromedriver: apt-get install chromium-driver"
    return None


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _chromedriver() -> str | None:
    return shutil.which("chromedriver") or (
        "/usr/bin/chromedriver" if os.access("/usr/bin/chromedriver", os.X_OK) else None
    )


def _require_browser() -> None:
    """Skip with the reason where the browser is missing; fail instead under CI's flag."""
    reason = _missing()
    if reason is None:
        return
    if os.environ.get("HANDLERKIT_REQUIRE_BROWSER") == "1":
        pytest.fail(f"HANDLERKIT_REQUIRE_BROWSER=1 but the browser test cannot run: {reason}")
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


STAGE_STEPPER = "\n".join([
    "import handlerkit as hk",
    "from handlerkit.widgets import Stepper",
    "",
    f"ctx = hk.MockContext.from_model_dir({str(MODEL_DIR)!r})",
    'h = hk.Harness("image_classifier", ctx)',
    "h.initialize()",
    f"stepper = Stepper(h, hk.batch(hk.Request.from_file({str(IMAGE)!r})))",
    "stepper",
])

# A running sum per sequence; a request stays for a second step when its number is odd.
SEQUENCE_STEPPER = """
import handlerkit as hk


def handle(data, context):
    if data is None:
        context.cache = {}
        return None
    answers = []
    for idx, row in enumerate(data):
        key = context.get_sequence_id(idx)
        if row:  # a request called again comes back with an empty row
            context.cache[key] = context.cache.get(key, 0) + int(row["body"])
        answers.append(context.cache[key])
    context.stopping_criteria = [lambda answer, row=row: not row or int(row["body"]) % 2 == 0 for row in data]
    return answers


stepper = hk.Stepper(hk.Sequences(hk.Harness(handle), continuous=True), pictures=False)
stepper
"""


def _write_notebook(path: Path, source: str) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


@contextlib.contextmanager
def _jupyter_lab(tmp: Path, deadline: float, source: str = STAGE_STEPPER) -> Iterator[str]:
    """``jupyter lab`` on loopback with no token, its config, data and runtime in ``tmp``;
    yields its URL once ``/api/status`` answers; ``stepper.ipynb`` holds one cell, ``source``.
    Kernels and server are gone afterwards."""
    root = tmp / "root"
    root.mkdir()
    _write_notebook(root / "stepper.ipynb", source)
    env = dict(os.environ)
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
        env[name] = str(tmp / name.lower())
    env["JUPYTER_PLATFORM_DIRS"] = "1"
    # No "get notified about Jupyter news?" toast over the page (news_url=None fetches nothing).
    settings = Path(env["JUPYTER_CONFIG_DIR"]) / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    env["MPLBACKEND"] = "Agg"
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        sys.executable, "-m", "jupyter", "lab", "--no-browser",
        "--ip=127.0.0.1", f"--port={port}", "--port-retries=0",
        f"--ServerApp.root_dir={root}",
        "--IdentityProvider.token=", "--ServerApp.password=",
        "--ServerApp.disable_check_xsrf=True",
        "--ServerApp.terminals_enabled=False",
        "--LabApp.expose_app_in_browser=True",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.handlers.announcements.NeverCheckForUpdate",
        f"--LabApp.workspaces_dir={tmp / 'workspaces'}",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-root")
    log_path = tmp / "jupyter.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)  # its own group: its kernels die with it
    try:
        while True:
            if server.poll() is not None:
                raise AssertionError(f"jupyter lab exited with {server.returncode}:\n{_tail(log_path)}")
            try:
                with urllib.request.urlopen(f"{url}/api/status", timeout=2) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"jupyter lab did not answer on {url}:\n{_tail(log_path)}")
            time.sleep(0.25)
        yield url
    except BaseException as exc:  # add the server's log to whatever failed
        if hasattr(exc, "add_note"):  # Python 3.11+
            exc.add_note(f"jupyter lab log:\n{_tail(log_path)}")
        raise
    finally:
        _stop(server, url)


def _stop(server: subprocess.Popen, url: str) -> None:
    """Shut the server down (it stops its kernels), then make sure its process group is gone."""
    with contextlib.suppress(OSError, urllib.error.URLError):
        request = urllib.request.Request(f"{url}/api/shutdown", method="POST")
        urllib.request.urlopen(request, timeout=5).close()
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=5)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(server.pid, signal.SIGKILL)  # a kernel left behind
    if server.poll() is None:
        server.wait(timeout=5)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


def _chrome(tmp: Path, deadline: float):
    """Headless Chromium whose profile, config and cache (crash reports, dconf) stay in ``tmp``."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    home = tmp / "chrome-home"
    env = dict(os.environ, HOME=str(home), XDG_CONFIG_HOME=str(home / "config"), XDG_CACHE_HOME=str(home / "cache"))
    options = webdriver.ChromeOptions()
    options.binary_location = _chromium()
    for flag in (*CHROME_FLAGS, f"--user-data-dir={home / 'profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(_chromedriver(), env=env), options=options)
    driver.set_page_load_timeout(max(5, deadline - time.monotonic()))
    driver.set_script_timeout(10)
    return driver


def _wait(driver, condition, what: str, deadline: float):
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, max(1.0, deadline - time.monotonic()), poll_frequency=0.25).until(condition)
    except TimeoutException:
        body = driver.execute_script("return document.body ? document.body.innerText : ''") or ""
        raise AssertionError(f"timed out waiting for {what}; the page says:\n{body[-3000:]}") from None


KERNEL_READY = """
const app = window.jupyterapp;
const panel = app && app.shell.currentWidget;
const session = panel && panel.sessionContext && panel.sessionContext.session;
return !!(session && session.kernel && panel.content && panel.content.widgets.length);
"""


def test_the_preprocess_button_shows_its_result_in_jupyterlab(tmp_path):
    _require_browser()
    from selenium.webdriver.common.by import By

    started = time.monotonic()
    deadline = started + DEADLINE_S
    marks = {}
    with _jupyter_lab(tmp_path, deadline) as url:
        marks["server up"] = time.monotonic()
        driver = _chrome(tmp_path, deadline)
        try:
            driver.get(f"{url}/lab/tree/stepper.ipynb")
            _wait(driver, lambda d: d.execute_script(KERNEL_READY), "the notebook and its kernel", deadline)
            marks["kernel ready"] = time.monotonic()
            driver.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells');")

            enabled = "//button[normalize-space()='{}' and not(@disabled)]"
            button = _wait(driver, lambda d: (d.find_elements(By.XPATH, enabled.format("preprocess")) or [None])[0],
                           "the Stepper's enabled preprocess button", deadline)
            assert driver.find_elements(By.XPATH, "//button[normalize-space()='inference' and @disabled]"), (
                "inference must wait for preprocess")
            marks["stepper shown"] = time.monotonic()
            button.click()

            def pane_shows_result(d):
                text = d.execute_script("return document.body.innerText") or ""
                return "preprocess ok" in text and "output=Tensor[1, 3, 224, 224] float32" in text

            _wait(driver, pane_shows_result, "the preprocess pane's StageResult", deadline)
            marks["result in the page"] = time.monotonic()
            _wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, ".widget-output .jp-RenderedImage img"),
                  "the picture of the preprocessed batch (hk.show) in the pane", deadline)
            # The click ran in the kernel and the Stepper followed: the next stage is enabled.
            _wait(driver, lambda d: d.find_elements(By.XPATH, enabled.format("inference")),
                  "the inference button to be enabled", deadline)
        finally:
            driver.quit()
    marks["all done"] = time.monotonic()
    print("browser test: " + ", ".join(f"{k} {t - started:.1f} s" for k, t in marks.items()))  # with -s


def test_the_sequence_steppers_buttons_show_each_step_in_jupyterlab(tmp_path):
    """hk.Stepper(seqs): a request typed in the page and sent, then two steps clicked: the
    steps' rows (joined, then called again and left) appear in the page."""
    _require_browser()
    from selenium.webdriver.common.by import By

    deadline = time.monotonic() + DEADLINE_S
    with _jupyter_lab(tmp_path, deadline, SEQUENCE_STEPPER) as url:
        driver = _chrome(tmp_path, deadline)
        try:
            driver.get(f"{url}/lab/tree/stepper.ipynb")
            _wait(driver, lambda d: d.execute_script(KERNEL_READY), "the notebook and its kernel", deadline)
            driver.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells');")
            box = _wait(driver, lambda d: (d.find_elements(By.CSS_SELECTOR, ".widget-text input") or [None])[0],
                        "the request box", deadline)
            assert driver.find_elements(By.XPATH, "//button[normalize-space()='step' and @disabled]"), (
                "step must wait for a request")
            box.send_keys("3")

            def click(name: str) -> None:
                path = f"//button[normalize-space()='{name}' and not(@disabled)]"
                _wait(driver, lambda d: (d.find_elements(By.XPATH, path) or [None])[0], f"the {name} button",
                      deadline).click()

            def page_shows(*texts: str):
                return lambda d: all(t in (d.execute_script("return document.body.innerText") or "") for t in texts)

            click("send")
            _wait(driver, page_shows("it runs in the next step"), "the queued request's message", deadline)
            click("step")
            _wait(driver, page_shows("step 0: 1 requests (1 joined, 0 continued, 0 left)"), "step 0's row", deadline)
            click("step")
            _wait(driver, page_shows("step 1: 1 requests (0 joined, 1 continued, 1 left)", "context.cache after step 1"),
                  "step 1's row and the state after it", deadline)
            _screenshot(driver, tmp_path, "sequence-stepper.png")
        finally:
            driver.quit()


SCREEN = (1280, 800)  # a laptop's screen: the whole Stepper must fit in it

# The Stepper's root widget in the page: the outermost widget box of the cell's output.
STEPPER_BOX = """
const root = document.querySelector('.jp-OutputArea-output .widget-box');
if (!root) return null;
const r = root.getBoundingClientRect();
return {top: r.top, left: r.left, width: r.width, height: r.height,
        innerWidth: window.innerWidth, innerHeight: window.innerHeight};
"""

# Where the result showing `arguments[0]` is: the innermost Output widget holding that text if
# it is displayed (a hidden tab's is not), widened to its stage's pane when there is one, then
# its pictures; null until there are `arguments[1]` rectangles and every picture is loaded.
RESULT_PANE = """
const [wanted, parts] = arguments;
const outputs = [...document.querySelectorAll('.jp-OutputArea-output .widget-output')]
  .filter(el => el.getClientRects().length && el.innerText.includes(wanted));
const output = outputs.find(el => !outputs.some(other => other !== el && el.contains(other)));
if (!output) return null;
const pane = output.closest('.handlerkit-stage') || output;
const images = [...pane.querySelectorAll('img')];
if (images.length + 1 < parts || !images.every(img => img.complete)) return null;
return [pane, ...images].map(el => el.getBoundingClientRect())
  .map(r => ({top: r.top, bottom: r.bottom, left: r.left, right: r.right}));
"""


def _screenshot(driver, tmp: Path, name: str) -> Path:
    """A screenshot of the window into ``tmp``, and into ``$HANDLERKIT_SCREENSHOTS`` when set (a
    folder a person looks at)."""
    path = tmp / name
    driver.save_screenshot(str(path))
    folder = os.environ.get("HANDLERKIT_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, Path(folder) / name)
    return path


def test_the_stepper_fits_one_screen_and_each_result_shows_where_its_button_is(tmp_path):
    """At 1280x800, with the Stepper scrolled to the top of the notebook as a person looking at
    it would: every stage clicked in turn shows its result (and its picture) inside the window,
    and after all four the whole widget still fits in it. Screenshots: ``stepper-<stage>.png``
    after each click, ``stepper.png`` at the end."""
    _require_browser()
    from selenium.webdriver.common.by import By

    deadline = time.monotonic() + DEADLINE_S
    width, height = SCREEN
    with _jupyter_lab(tmp_path, deadline) as url:
        driver = _chrome(tmp_path, deadline)
        try:
            # The page's own size, exactly (a window's size includes the browser's frame).
            driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                                   {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
            driver.get(f"{url}/lab/tree/stepper.ipynb")
            _wait(driver, lambda d: d.execute_script(KERNEL_READY), "the notebook and its kernel", deadline)
            driver.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells');")
            enabled = "//button[normalize-space()='{}' and not(@disabled)]"
            _wait(driver, lambda d: d.find_elements(By.XPATH, enabled.format("preprocess")),
                  "the Stepper's enabled preprocess button", deadline)
            driver.execute_script(
                "document.querySelector('.jp-OutputArea-output .widget-box').scrollIntoView({block: 'start'});")
            problems = []
            for stage in ("initialize", "preprocess", "inference", "postprocess"):
                path = enabled.format(stage)
                _wait(driver, lambda d, path=path: (d.find_elements(By.XPATH, path) or [None])[0],
                      f"the enabled {stage} button", deadline).click()
                time.sleep(0.25)  # the click reaches the kernel, which disables the buttons until the stage is done
                _wait(driver, lambda d: d.find_elements(By.XPATH, enabled.format("run all")), f"{stage} to finish",
                      deadline)
                parts = 2 if stage in ("preprocess", "inference") else 1  # the pane, and its picture
                rects = _wait(driver, lambda d, stage=stage, parts=parts: d.execute_script(RESULT_PANE, f"{stage} ok", parts),
                              f"the {stage} pane showing its result", deadline)
                _screenshot(driver, tmp_path, f"stepper-{stage}.png")
                outside = [r for r in rects if r["top"] < 0 or r["bottom"] > height or r["left"] < 0 or r["right"] > width]
                if outside:
                    problems.append(f"{stage}: its result lies outside the {width}x{height} window: {outside}")
            box = driver.execute_script(STEPPER_BOX)
            shot = _screenshot(driver, tmp_path, "stepper.png")
            assert (box["innerWidth"], box["innerHeight"]) == SCREEN, box
            assert box["height"] <= height and box["width"] <= width, (
                f"the Stepper is {box['width']:.0f}x{box['height']:.0f} px after four clicks; see {shot}")
            assert not problems, "\n".join(problems)
        finally:
            driver.quit()
