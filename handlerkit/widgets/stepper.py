"""``hk.Stepper``: click through a handler's stages in a notebook, one button per stage.

The Stepper is a view on a :class:`~handlerkit.harness.Harness`: every button calls the
harness (``h.initialize()``, ``h.preprocess(batch)``, ``h.inference()``,
``h.postprocess()``), so ``h.results`` holds what the buttons produced and a cell can pick up
where the buttons left off. The panes are redrawn from ``h.results``, never from a copy::

    stepper = hk.Stepper(h, hk.batch(hk.Request.from_file("fixtures/images/circle.png")))
    stepper                          # the widget
    stepper.buttons["preprocess"].click()
    h.results["preprocess"].output   # the tensor the pane shows

A stage's button is enabled once the stage before it succeeded. A failing stage shows its
error and fix in its pane and disables the stages after it; the Stepper stays usable (fix
the handler, ``h.reload()``, click again). ``hk.Stepper(seqs)`` on ``hk.Sequences`` steps a
sequence instead (:mod:`~handlerkit.widgets.sequence`). Needs the ``[notebook]`` extra
(ipywidgets; pictures need matplotlib).
"""

from __future__ import annotations

import html
import mimetypes
import warnings
from typing import Any

from handlerkit._optional import require
from handlerkit.errors import HandlerkitError
from handlerkit.sequences import Sequences
from handlerkit.widgets import panes
from handlerkit.widgets.live import LivePanes
from handlerkit.widgets.panes import PANE_HEIGHT
from handlerkit.widgets.sequence import SequenceStepper
from handlerkit.worker.batches import Batch
from handlerkit.worker.requests import Request

__all__ = ["Stepper"]

STAGES = ("initialize", "preprocess", "inference", "postprocess")
_ANSWERS = ("postprocess", "handle")  # stages whose output is the answer a client gets
_NEEDS_BATCH = "add a request with the upload button, or set stepper.batch = hk.batch(...)"


class Stepper:
    """An ipywidgets UI over a Harness: a button and a tab per stage.

    The buttons sit in one row over a ``Tab``: a click selects its stage's tab, where the
    result appears (its table, logs and warnings on the left; its picture, or for
    ``postprocess`` the answer each request gets, on the right). The stream, wall time,
    device and compile views are tabs too, so the widget stays within one screen.

    Args:
        harness: the :class:`~handlerkit.Harness` the buttons drive.
        batch: the batch preprocess gets (anything ``h.preprocess`` accepts), or None to start
            empty and add requests with the upload button.
        pictures: draw each stage's output with :func:`handlerkit.viz.show` (needs matplotlib).

    Attributes:
        buttons: stage → ``Button``; ``run_all_button``, ``reset_button``.
        outputs: stage → ``Output`` holding the stage's result (with its tensor summaries),
            logs and warnings; or its error and fix.
        picture_outputs: stage → ``Output`` beside it: the stage's picture (``hk.show``), or
            for ``postprocess`` (and ``handle``) the answer each request gets.
        tabs: the ``Tab`` (``tab_names``: the stages, ``stream``, ``wall time``, ``device``,
            ``compile``); :meth:`select` shows one.
        upload: a ``FileUpload``; each file becomes a request added to the batch.
        batch_size: an ``HTML`` widget saying how many requests the batch holds; ``status``
            says what is running or what an upload added.
        timing: an ``HTML`` widget with each stage's wall time as a bar (the ``wall time`` tab).
        device_output / compile_output: the device report and the compile report.
        compile_button: runs ``h.compile_report(batch)`` into ``compile_output``.
        stream_button: runs ``h.stream(batch)`` (:meth:`stream`); ``live`` holds a pane per
            request that shows each chunk as the handler sends it, then the final answer.
        widget: the root widget (what a notebook cell displays).

    For a function handler (or one without stage methods) there is one ``handle`` button in
    place of the three stages: it runs ``h.run(batch)``, as TorchServe's worker would.
    """

    def __new__(cls, harness: Any, *args: Any, **kwargs: Any) -> Any:
        """``hk.Stepper(seqs, ...)`` on ``hk.Sequences`` is its steps' Stepper (:mod:`~handlerkit.widgets.sequence`)."""
        if isinstance(harness, Sequences):
            return SequenceStepper(harness, *args, **kwargs)
        return super().__new__(cls)

    def __init__(self, harness: Any, batch: Any = None, *, pictures: bool = True) -> None:
        self._w = require("ipywidgets", feature="hk.Stepper", extra="notebook")
        self.harness = harness
        self.pictures = pictures
        self._initial = None if batch is None else Batch.coerce(batch)
        self._batch: Batch | None = self._initial
        self._busy = False
        self._shown: dict[str, Any] = {}  # stage → the StageResult (or error) its pane shows
        self._caught: dict[str, tuple[Any, list[Any]]] = {}  # stage → (its result, warnings caught around the call)
        self._panels_for: tuple[Any, ...] | None = None  # the results the panels were drawn for
        handler = harness.handler
        stepwise = not harness.is_function and all(
            callable(getattr(handler, s, None)) for s in ("preprocess", "inference", "postprocess")
        )
        self.stages: tuple[str, ...] = STAGES if stepwise else ("initialize", "handle")
        self._build()
        self.refresh()

    # -- layout --------------------------------------------------------------------------
    def _build(self) -> None:
        w = self._w
        compact = w.Layout(width="auto")  # a button as wide as its word: the row fits the output area
        self.buttons = {s: w.Button(description=s, tooltip=self._tooltip(s), layout=compact) for s in self.stages}
        for stage, button in self.buttons.items():
            button.on_click(lambda _b, stage=stage: self.run(stage))
        self.run_all_button = w.Button(
            description="run all",
            button_style="primary",
            tooltip="run every stage in order, stopping at the first failure",
            layout=compact,
        )
        self.run_all_button.on_click(lambda _b: self.run_all())
        self.reset_button = w.Button(
            description="reset", tooltip="drop the results after initialize and the uploaded requests", layout=compact
        )
        self.reset_button.on_click(lambda _b: self.reset())
        self.stream_button = w.Button(
            description="stream", tooltip="h.stream(batch): each chunk shown as it is sent", layout=compact
        )
        self.stream_button.on_click(lambda _b: self.stream())
        self.live = LivePanes(w)
        self.upload = w.FileUpload(description="add request", multiple=True, accept="")
        self.upload.observe(self._on_upload, names="value")
        self.batch_size = w.HTML()
        self.status = w.HTML()
        self.timing = w.HTML()
        self.outputs = {s: w.Output() for s in self.stages}
        self.picture_outputs = {s: w.Output() for s in self.stages}
        self._titles = {s: w.HTML() for s in self.stages}
        self.device_output = w.Output()
        self.compile_decision = w.HTML()
        self.compile_button = w.Button(
            description="compile report", tooltip="h.compile_report(batch): compiles and runs the batch", layout=compact
        )
        self.compile_button.on_click(lambda _b: self.compile_report())
        self.compile_output = w.Output()
        # One tab per stage, so a result appears right under the buttons, in the tab its click
        # selects, and the widget keeps one height however many stages ran (issue 28: four
        # stacked panes made a 2,000-px column). Each stage's tab holds its result, logs and
        # warnings on the left and its picture (or the answer) on the right.
        tabs = {
            stage: self._pane(self.outputs[stage], self.picture_outputs[stage], self._titles[stage])
            for stage in self.stages
        }
        tabs["stream"] = self._pane(self.live.widget)
        tabs["wall time"] = self._pane(self.timing)
        tabs["device"] = self._pane(self.device_output)
        tabs["compile"] = self._pane(w.VBox([self.compile_decision, self.compile_button, self.compile_output]))
        self.tab_names: tuple[str, ...] = tuple(tabs)
        self.tabs = w.Tab(children=list(tabs.values()), titles=self.tab_names)
        header = w.HTML(f"<b>Stepper</b> &middot; {html.escape(self.harness.name)}{self._note()}")
        self.widget = w.VBox(
            [
                header,
                w.HBox(
                    [*self.buttons.values(), self.run_all_button, self.stream_button, self.reset_button],
                    layout=w.Layout(flex_flow="row wrap"),
                ),
                w.HBox([self.upload, self.batch_size, self.status], layout=w.Layout(align_items="center")),
                self.tabs,
            ]
        )
        self.widget.add_class("handlerkit-stepper")

    def _pane(self, main: Any, side: Any = None, title: Any = None) -> Any:
        """A tab's content: ``main`` (under ``title``), and ``side`` beside it; never taller than
        :data:`PANE_HEIGHT` (it scrolls inside), so the whole Stepper stays within one screen."""
        w = self._w
        main_box = w.VBox([title, main] if title is not None else [main], layout=w.Layout(flex="1 1 0", min_width="0"))
        children = (
            [main_box] if side is None else [main_box, w.Box([side], layout=w.Layout(flex="0 1 auto", max_width="50%"))]
        )
        pane = w.HBox(children, layout=w.Layout(max_height=PANE_HEIGHT, overflow="auto"))
        pane.add_class("handlerkit-stage")
        return pane

    def select(self, tab: str) -> None:
        """Show one tab: a stage's (what its button does), ``stream``, ``wall time``, ``device`` or ``compile``."""
        if tab not in self.tab_names:
            raise ValueError(f"no {tab!r} tab; the tabs are {', '.join(self.tab_names)}")
        self.tabs.selected_index = self.tab_names.index(tab)

    def _tooltip(self, stage: str) -> str:
        if stage == "handle":
            return "h.run(batch): handle(data, context), as TorchServe's worker calls it"
        if stage == "initialize":
            return "h.initialize()"
        return f"h.{stage}({'batch' if stage == 'preprocess' else ''})"

    def _note(self) -> str:
        if "handle" in self.stages:
            return " &middot; no stage methods: the handle button runs h.run(batch)"
        if self.harness.single_stage:
            return (
                " &middot; <i>this handler has its own handle: the server runs that, not these stages "
                "one by one; compare with h.run(batch)</i>"
            )
        return ""

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    # -- the batch -----------------------------------------------------------------------
    @property
    def batch(self) -> Batch | None:
        """The batch preprocess gets; setting it drops the results after initialize."""
        return self._batch

    @batch.setter
    def batch(self, value: Any) -> None:
        self._batch = None if value is None else Batch.coerce(value)
        self._invalidate()

    def add_request(self, request: Request) -> None:
        """Add a request to the batch (what the upload button does); later stages are dropped."""
        if not isinstance(request, Request):
            raise TypeError(f"add_request takes a handlerkit Request; got {type(request).__name__}")
        requests = list(self._batch or ()) + [request]
        decode = self._batch.decode if self._batch is not None else None
        self._batch = Batch(requests, decode=decode)
        self._invalidate()

    def _on_upload(self, change: dict[str, Any]) -> None:
        files = change.get("new") or ()
        if not files:
            return  # the reset of the value below
        try:
            for f in files:
                name = f.get("name") or "upload"
                content_type = f.get("type") or mimetypes.guess_type(name)[0]
                self.add_request(Request.from_bytes(bytes(f["content"]), content_type))
            names = ", ".join(f.get("name") or "?" for f in files)
            self.status.value = f"<span>added {len(files)} request(s): {html.escape(names)}</span>"
        except Exception as exc:  # a callback's exception would vanish into the kernel's log
            self.status.value = (
                f"<span style='color:#d62728'>upload failed: {html.escape(f'{type(exc).__name__}: {exc}')}</span>"
            )
        finally:
            self.upload.value = ()
            self.refresh()

    def _invalidate(self) -> None:
        """The batch changed: what preprocess and later made no longer belongs to it."""
        self.harness.discard("preprocess")
        self._forget_errors()
        self.refresh()

    def _forget_errors(self) -> None:
        """Errors that left no result (a harness refusal) are shown until the next action."""
        for stage, shown in list(self._shown.items()):
            if isinstance(shown, BaseException):
                del self._shown[stage]

    # -- actions -------------------------------------------------------------------------
    def run(self, stage: str) -> Any:
        """Run one stage as its button does; returns its StageResult (or Run), None on failure.

        A failure is shown in the stage's pane, never raised: the Stepper lives in callbacks,
        where an exception would only reach the kernel's log.
        """
        if stage not in self.stages:
            raise ValueError(f"no {stage!r} button; the stages are {', '.join(self.stages)}")
        self.select(stage)  # its result appears where the person looks: under the buttons
        self._busy = True
        self._forget_errors()
        self._set_enabled()
        self.status.value = f"<span>running {stage}…</span>"
        result = None
        caught: list[Any] = []
        try:
            with warnings.catch_warnings(record=True) as caught:
                result = self._call(stage)
        except HandlerkitError as exc:  # StageError (kept in h.results too) or a harness refusal
            done = self.harness.results.get(stage)
            if done is None or done.error is not exc:
                self._show_error(stage, exc, unexpected=False)
        except Exception as exc:  # a bug: show it with its traceback
            self._show_error(stage, exc, unexpected=True)
        finally:
            self._caught[stage] = (self.harness.results.get(stage), list(caught))
            self._busy = False
            self.status.value = ""
            self.refresh()
        return result

    def stream(self) -> Any:
        """``h.stream(batch)``: each chunk shown in its request's live pane as it is sent, then
        each request's final answer and the run's stages in their panes; returns the Run, or
        None when ``handle`` failed (the panes say why; the Stepper stays usable)."""
        if self._batch is None:
            self.status.value = (
                f"<span style='color:#d62728'>streaming needs a batch: {html.escape(_NEEDS_BATCH)}</span>"
            )
            return None
        self.select("stream")
        self._busy = True
        self._set_enabled()
        self.status.value = "<span>streaming…</span>"
        self.live.start(len(self._batch))
        run = None
        try:
            with warnings.catch_warnings(record=True):  # the run's problems: kept with its last stage
                chunks = self.harness.stream(self._batch)
                while True:
                    try:
                        self.live.add(next(chunks))
                    except StopIteration as done:
                        run = done.value
                        break
            self.live.finish(run)
        except Exception as exc:  # a callback's exception would vanish into the kernel's log
            self.live.fail(exc)
        finally:
            self._busy = False
            self.status.value = ""
            self.refresh()
        return run

    def _call(self, stage: str) -> Any:
        h = self.harness
        if stage == "initialize":
            return h.initialize()
        if self._batch is None:
            raise HandlerkitError(f"{stage} needs a batch, and this Stepper has none", fix=_NEEDS_BATCH)
        if stage == "preprocess":
            return h.preprocess(self._batch)
        if stage == "handle":
            return h.run(self._batch)
        return getattr(h, stage)()

    def text(self, stage: str) -> str:
        """What the stage's tab shows, as text: its result or error and fix, logs, warnings,
        then its picture's size (or the answer, for ``postprocess`` and ``handle``)."""
        if stage not in self.outputs:
            raise ValueError(f"no {stage!r} pane; the stages are {', '.join(self.stages)}")
        return panes.output_text([*self.outputs[stage].outputs, *self.picture_outputs[stage].outputs])

    def run_all(self) -> None:
        """Initialize when it has not succeeded, then every stage in order; stop at a failure."""
        for stage in self.stages:
            done = self.harness.results.get(stage)
            if stage == "initialize" and done is not None and done.ok:
                continue
            if self.run(stage) is None:
                break

    def reset(self) -> None:
        """Back to the batch the Stepper was given: the uploads and the results after
        initialize are dropped (the loaded model stays; click initialize to load it again)."""
        self._batch = self._initial
        self.compile_output.outputs = ()
        self._invalidate()

    def compile_report(self) -> Any:
        """``h.compile_report(batch)`` shown in the compile panel (compiling takes a while)."""
        self.select("compile")
        self.compile_output.outputs = (panes.stream_output("compiling and running the batch…\n"),)
        self._busy = True
        self._set_enabled()
        try:
            if self._batch is None:
                raise HandlerkitError(
                    "the compile report runs the batch, and this Stepper has none",
                    fix="add a request with the upload button first",
                )
            report = self.harness.compile_report(self._batch)
            self.compile_output.outputs = (panes.bundle_output(report),)
            return report
        except Exception as exc:
            self.compile_output.outputs = (
                panes.error_output("compile report", exc, unexpected=not isinstance(exc, HandlerkitError)),
            )
            return None
        finally:
            self._busy = False
            self.refresh()

    # -- drawing -------------------------------------------------------------------------
    def refresh(self) -> None:
        """Redraw from ``h.results``: panes whose result changed, timings, panels, buttons."""
        results = self.harness.results
        for stage in self.stages:
            result = results.get(stage)
            if result is None and isinstance(self._shown.get(stage), BaseException):
                continue  # an error that left no result (a harness refusal) stays shown
            if stage not in self._shown or self._shown[stage] is not result:
                self._draw(stage, result)
        count = len(self._batch) if self._batch is not None else 0
        self.batch_size.value = f"batch: {count} request{'s' if count != 1 else ''}"
        self.timing.value = panes.timing_html(
            {s: (results[s].wall_ms, results[s].ok) for s in self.stages if results.get(s) is not None}
        )
        self._draw_panels()
        self._set_enabled()

    def _set_enabled(self) -> None:
        results = self.harness.results
        previous_ok = True
        for stage in self.stages:
            ready = previous_ok and (stage == "initialize" or self._batch is not None)
            self.buttons[stage].disabled = self._busy or not ready
            done = results.get(stage)
            self.buttons[stage].button_style = "" if done is None else ("success" if done.ok else "danger")
            previous_ok = done is not None and done.ok
        for button in (self.run_all_button, self.reset_button, self.compile_button):
            button.disabled = self._busy
        self.run_all_button.disabled = self.stream_button.disabled = self._busy or self._batch is None

    def _draw(self, stage: str, result: Any) -> None:
        self._shown[stage] = result
        title = self._titles[stage]
        self.picture_outputs[stage].outputs = ()
        if result is None:
            title.value = f"<b>{stage}</b> <span style='color:#777'>not run</span>"
            self.outputs[stage].outputs = ()
            return
        # A result names its stage in its own first line; a failure gets a title of its own.
        title.value = (
            ""
            if result.ok
            else f"<b>{stage}</b> <span style='color:#d62728'>failed</span> <span style='color:#777'>{result.wall_ms:.2f} ms</span>"
        )
        outs: list[dict[str, Any]] = []
        if result.error is not None:  # the result's own table would repeat the error
            outs.append(panes.error_output(stage, result.error))
        else:
            outs.append(panes.bundle_output(result))
        seen = {id(w.message) for w in result.warnings}  # the stage's own, shown again when it ends
        owner, caught = self._caught.get(stage, (None, []))
        extra = [w for w in caught if id(w.message) not in seen] if owner is result else []
        logs = panes.logs_output(result.logs, [*result.warnings, *extra])
        if logs is not None:
            outs.append(logs)
        self.outputs[stage].outputs = tuple(outs)
        if not result.ok or stage == "initialize":
            return
        if stage in _ANSWERS:  # what the client gets; a picture of it would redraw inference's
            self.picture_outputs[stage].outputs = tuple(panes.answer_outputs(result.output, pictures=self.pictures))
        elif self.pictures:
            self.picture_outputs[stage].outputs = (panes.picture_output(result),)

    def _show_error(self, stage: str, exc: BaseException, *, unexpected: bool) -> None:
        self._shown[stage] = exc
        self.picture_outputs[stage].outputs = ()
        self._titles[stage].value = f"<b>{stage}</b> <span style='color:#d62728'>failed</span>"
        self.outputs[stage].outputs = (panes.error_output(stage, exc, unexpected=unexpected),)

    def _draw_panels(self) -> None:
        shown = tuple(self.harness.results.get(s) for s in self.stages)  # redraw when any changed
        if self._panels_for is not None and all(a is b for a, b in zip(shown, self._panels_for)):
            return
        self._panels_for = shown
        init = shown[0]
        decisions = getattr(self.harness.handler, "decisions", None)
        self.compile_decision.value = panes.compile_html(
            getattr(decisions, "compile", None) if init is not None else None
        )
        if init is None:
            self.device_output.outputs = (panes.stream_output("run initialize to see the device report\n"),)
            return
        try:
            self.device_output.outputs = (panes.bundle_output(self.harness.device_report()),)
        except Exception as exc:
            self.device_output.outputs = (
                panes.error_output("device report", exc, unexpected=not isinstance(exc, HandlerkitError)),
            )
