"""``hk.Stepper(seqs)``: click through a sequence's steps, as TorchServe's frontend and worker run them.

The view on :class:`~handlerkit.sequences.Sequences` that :class:`~handlerkit.widgets.Stepper`
is on a Harness: every button calls ``seqs`` (``seqs.start`` / ``send``, ``seqs.step()``,
``seqs.run()``), so ``seqs.steps`` holds what the buttons produced and a cell can pick up where
they left off::

    seqs = hk.Sequences(h)                                   # continuousBatching from its config
    stepper = hk.Stepper(seqs, end=hk.Request.text("0"), cancel=hk.Request.text("-1"))
    stepper                                                  # the widget
    stepper.send("3"); stepper.step_button.click()
    stepper.text("steps")                                    # what the steps pane shows

Its panes: a row per step (the batch that ran: who joined, who was called again because its
answer said ``ts_stream_next: true``, who finished or was cancelled; each answer and the chunks
sent), each request with its state, answers and chunks, the handler's state after a chosen step
(the step's copy of ``context.cache`` as a table, its tensors summarised; drawn by ``hk.show``
too when ``draw_state`` is ticked) and the per-step batches drawn by ``hk.show(seqs)``. TorchServe has no end or cancel of its own: a handler reads
a request as one (its example takes ``0`` and ``-1``), so the end and cancel buttons send the
requests given as ``end=`` and ``cancel=`` into the chosen sequence and run a step. A failure is
shown in the message pane with its fix, never raised: the widget lives in callbacks.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from handlerkit._optional import require
from handlerkit._text import render_html, render_text
from handlerkit.errors import HandlerkitError
from handlerkit.sequences import Job, Sequences, Step
from handlerkit.summaries import describe, iter_tensors, summary
from handlerkit.widgets import panes
from handlerkit.widgets.panes import PANE_HEIGHT
from handlerkit.worker.requests import Request

__all__ = ["SequenceStepper"]

NEW = "new sequence"
MAX_STEPS = 50  # step rows shown, the last ones
PANES = ("message", "steps", "requests", "state", "picture")


class SequenceStepper:
    """An ipywidgets UI over :class:`~handlerkit.sequences.Sequences` (see the module docs).

    Args:
        sequences: the ``hk.Sequences`` the buttons drive.
        request: makes a request from the text box's value (default ``hk.Request.text``).
        end / cancel: the requests the handler reads as ending / cancelling a sequence, or None
            (their buttons are then disabled).
        pictures: draw the per-step batches with ``hk.show`` (needs matplotlib).

    Attributes:
        body: the ``Text`` box the next request is made from; ``target``: a ``Dropdown`` of
            the open sequences (``"new sequence"`` opens one).
        send_button / step_button / run_button / end_button / cancel_button: send the request
            (queued for the next step), run one step, run to the end (``seqs.run()``), end or
            cancel the chosen sequence.
        step_picker: a ``Dropdown`` of the steps; the state pane shows the handler's state after it.
        draw_state: a ``Checkbox``: the state pane draws that state with ``hk.show`` too (off at
            first: a picture of a cache of tensors takes about half a second on two cores,
            at every step).
        outputs: pane name (``message``, ``steps``, ``requests``, ``state``, ``picture``) →
            ``Output``; :meth:`text` reads one as text.
        widget: the root widget (what a notebook cell displays).
    """

    def __init__(
        self,
        sequences: Sequences,
        *,
        request: Callable[[str], Request] = Request.text,
        end: Request | None = None,
        cancel: Request | None = None,
        pictures: bool = True,
    ) -> None:
        if not isinstance(sequences, Sequences):
            raise TypeError(f"SequenceStepper drives an hk.Sequences; got {type(sequences).__name__}")
        self._w = require("ipywidgets", feature="hk.Stepper", extra="notebook")
        self.sequences = sequences
        self.make_request = request
        self.end_request, self.cancel_request = end, cancel
        self.pictures = pictures
        self._busy = False
        self._chosen: str | None = None  # the sequence the last action sent to: chosen after a refresh
        self._build()
        self.refresh()

    # -- layout --------------------------------------------------------------------------
    def _build(self) -> None:
        w = self._w
        self.body = w.Text(placeholder="the next request's body", description="request")
        self.target = w.Dropdown(options=[NEW], value=NEW, description="into")
        self.send_button = w.Button(description="send", tooltip="queue the request: it runs in the next step")
        self.step_button = w.Button(description="step", button_style="primary", tooltip="seqs.step(): one worker call")
        self.run_button = w.Button(
            description="run to end", tooltip="seqs.run(): step until nothing is queued or running"
        )
        self.end_button = w.Button(description="end sequence", tooltip=self._tooltip("end", self.end_request))
        self.cancel_button = w.Button(
            description="cancel sequence", tooltip=self._tooltip("cancel", self.cancel_request)
        )
        self.send_button.on_click(lambda _b: self.send())
        self.step_button.on_click(lambda _b: self.step())
        self.run_button.on_click(lambda _b: self.run_to_end())
        self.end_button.on_click(lambda _b: self.end())
        self.cancel_button.on_click(lambda _b: self.cancel())
        self.step_picker = w.Dropdown(options=[], description="state after")
        self.step_picker.observe(lambda _change: self._draw_state(), names="value")
        self.draw_state = w.Checkbox(value=False, description="draw it (hk.show)", indent=False)
        self.draw_state.observe(lambda _change: self._draw_state(), names="value")
        self.outputs = {name: w.Output() for name in PANES}
        seqs = self.sequences
        mode = "continuous batching" if seqs.continuous else "sequence batching"
        header = w.HTML(
            f"<b>Stepper</b> &middot; {html.escape(seqs.harness.name)} &middot; {mode}, batchSize {seqs.batch_size}"
        )
        # Tabs under the buttons, as the stage Stepper has (issue 28): the widget keeps one
        # height however many steps ran, and what a click made is where the person looks. The
        # steps tab shows the newest step first, the handler's state after the chosen step beside.
        state = w.VBox(
            [w.HBox([self.step_picker, self.draw_state]), self.outputs["state"]],
            layout=w.Layout(flex="0 1 auto", max_width="50%"),
        )
        steps = w.VBox([self.outputs["steps"]], layout=w.Layout(flex="1 1 0", min_width="0"))
        tabs = {
            "steps": w.HBox([steps, state]),
            "requests": w.Box([self.outputs["requests"]]),
            "picture": w.Box([self.outputs["picture"]]),
        }
        for pane in tabs.values():
            pane.layout.max_height, pane.layout.overflow = PANE_HEIGHT, "auto"
            pane.add_class("handlerkit-stage")
        self.tab_names: tuple[str, ...] = tuple(tabs)
        self.tabs = w.Tab(children=list(tabs.values()), titles=self.tab_names)
        compact = w.Layout(width="auto")
        for button in (self.send_button, self.step_button, self.run_button, self.end_button, self.cancel_button):
            button.layout = compact
        self.widget = w.VBox(
            [
                header,
                w.HBox([self.body, self.target, self.send_button], layout=w.Layout(flex_flow="row wrap")),
                w.HBox([self.step_button, self.run_button, self.end_button, self.cancel_button]),
                self.outputs["message"],
                self.tabs,
            ]
        )
        self.widget.add_class("handlerkit-stepper")

    @staticmethod
    def _tooltip(what: str, request: Request | None) -> str:
        if request is None:
            return f"pass {what}=hk.Request... : the request the handler reads as the {what} of a sequence"
        return f"send {_short(request.data(), 60)} as the {what} of the chosen sequence, then run a step"

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    def select(self, tab: str) -> None:
        """Show one tab: ``steps`` (with the state beside), ``requests`` or ``picture``."""
        if tab not in self.tab_names:
            raise ValueError(f"no {tab!r} tab; the tabs are {', '.join(self.tab_names)}")
        self.tabs.selected_index = self.tab_names.index(tab)

    def text(self, pane: str) -> str:
        """What a pane shows, as text (``message``, ``steps``, ``requests``, ``state``, ``picture``)."""
        if pane not in self.outputs:
            raise ValueError(f"no {pane!r} pane; the panes are {', '.join(PANES)}")
        return panes.output_text(self.outputs[pane].outputs)

    # -- actions -------------------------------------------------------------------------
    def send(self, body: str | None = None) -> Job | None:
        """Queue a request made from ``body`` (default: the text box) into the chosen sequence,
        or a new one; returns its Job (None when the frontend refused it: the message pane says why)."""
        text = self.body.value if body is None else body
        return self._act("send", lambda: self._send(self.make_request(text)), show="requests")

    def step(self) -> Step | None:
        """One worker call (``seqs.step()``); None when there was no work or the batch failed."""
        return self._act("step", self._step)

    def run_to_end(self) -> list[Step] | None:
        """``seqs.run()``: step until nothing is queued or running; the steps taken."""
        return self._act("run to end", self.sequences.run)

    def end(self) -> Step | None:
        """Send the ``end=`` request into the chosen sequence and run a step."""
        return self._act("end", lambda: self._send_and_step("end", self.end_request))

    def cancel(self) -> Step | None:
        """Send the ``cancel=`` request into the chosen sequence as its cancel and run a step:
        the streams its handler stops in that step are marked cancelled."""
        return self._act("cancel", lambda: self._send_and_step("cancel", self.cancel_request))

    def _act(self, what: str, action: Callable[[], Any], show: str = "steps") -> Any:
        self.select(show)  # where what the click makes appears
        self._busy = True
        self._set_enabled()
        self.outputs["message"].outputs = ()
        try:
            return action()
        except Exception as exc:  # a callback's exception would vanish into the kernel's log
            self.outputs["message"].outputs = (
                panes.error_output(what, exc, unexpected=not isinstance(exc, HandlerkitError)),
            )
            return None
        finally:
            self._busy = False
            self.refresh()

    def _send(self, request: Request) -> Job:
        chosen = self.target.value
        job = self.sequences.send(request, sequence_id=None if chosen == NEW else chosen)
        self._say(f"queued request {job.request_id[:8]} in {job.sequence_id}: it runs in the next step")
        self._chosen = job.sequence_id
        return job

    def _step(self) -> Step | None:
        step = self.sequences.step()
        if step is None:
            self._say("nothing to run: no request is queued or running")
        return step

    def _send_and_step(self, what: str, request: Request | None) -> Step | None:
        if request is None:
            raise HandlerkitError(
                f"this Stepper has no {what} request: TorchServe has no {what} of its own, the handler "
                f"reads a request as one",
                fix=f"pass the request your handler reads as {what}: hk.Stepper(seqs, {what}=hk.Request.text(...))",
            )
        sequence = self.sequences.sequences.get(self.target.value)
        if sequence is None:
            raise HandlerkitError(
                f"{what} needs an open sequence; the chosen one is {self.target.value!r}",
                fix="choose an open sequence in the 'into' list (send a request first to open one)",
            )
        job = sequence.cancel(request) if what == "cancel" else sequence.send(request)
        self._chosen = job.sequence_id
        return self._step()

    def _say(self, text: str) -> None:
        self.outputs["message"].outputs = (panes.stream_output(text + "\n"),)

    # -- drawing -------------------------------------------------------------------------
    def refresh(self) -> None:
        """Redraw every pane from ``seqs``: the steps, the requests, the state and the picture."""
        seqs = self.sequences
        open_ids = list(seqs.sequences)
        keep = self._chosen if self._chosen in open_ids else self.target.value
        self._chosen = None  # once: later the person's own choice stays
        self.target.options = [NEW, *open_ids]
        self.target.value = keep if keep in open_ids else NEW
        shown = seqs.steps[-MAX_STEPS:]
        outs = [panes.bundle_output(step) for step in reversed(shown)]  # the newest first: under the buttons
        if len(shown) < len(seqs.steps):
            outs.append(panes.stream_output(f"the last {len(shown)} of {len(seqs.steps)} steps, the newest first\n"))
        self.outputs["steps"].outputs = tuple(outs) or (panes.stream_output("no step has run yet\n"),)
        self.outputs["requests"].outputs = (_requests_output(seqs.jobs),)
        options = [(f"step {s.index}", s.index) for s in seqs.steps]
        latest = options[-1][1] if options else None
        if list(self.step_picker.options) != options:
            self.step_picker.options = options
        if self.step_picker.value != latest:
            self.step_picker.value = latest  # its observer draws the state
        else:
            self._draw_state()
        self.outputs["picture"].outputs = (panes.picture_output(seqs),) if self.pictures and seqs.steps else ()
        self._set_enabled()

    def _set_enabled(self) -> None:
        chosen_open = self.target.value in self.sequences.sequences
        self.send_button.disabled = self._busy
        self.step_button.disabled = self.run_button.disabled = self._busy or not self.sequences.pending
        self.end_button.disabled = self._busy or self.end_request is None or not chosen_open
        self.cancel_button.disabled = self._busy or self.cancel_request is None or not chosen_open

    def _draw_state(self) -> None:
        index = self.step_picker.value
        if index is None:
            self.outputs["state"].outputs = (panes.stream_output("the handler's state shows after the first step\n"),)
            return
        step = self.sequences.steps[index]
        outs = [_state_output(step)]
        if self.draw_state.value and step.cache:
            outs.append(panes.picture_output(step.cache))
        self.outputs["state"].outputs = tuple(outs)


def _requests_output(jobs: list[Job]) -> dict[str, Any]:
    """Each request sent: its sequence, state, the steps it was in, its answers and chunks."""
    rows = [
        (
            job.request_id[:8],
            job.sequence_id,
            job.state + (" (its cancel)" if job.cancels else ""),
            _span(job.steps),
            _short(_answers(job.answers)),
            _short("".join(c.text for c in job.chunks)) if job.chunks else "",
        )
        for job in jobs
    ]
    headers = ("request", "sequence", "state", "steps", "answers", "chunks")
    title = f"{len(jobs)} request(s)"
    return panes.html_output(render_html(headers, rows, title), render_text(headers, rows, title))


def _state_output(step: Step) -> dict[str, Any]:
    """The handler's state after ``step``: a row per ``context.cache`` key, with its value (or
    its tensors' one-line summaries)."""
    cache = step.cache
    title = f"context.cache after step {step.index}"
    if not isinstance(cache, dict):
        text = f"{title}: {describe(cache)}" if cache is not None else f"{title}: the handler set none"
        return panes.html_output(f"<div>{html.escape(text)}</div>", text)
    rows = [(str(key), describe(value), _value(value)) for key, value in cache.items()]
    headers = ("key", "holds", "value")
    return panes.html_output(render_html(headers, rows, title), render_text(headers, rows, title, wrap=100))


def _value(value: Any) -> str:
    """A value as text: itself when it holds no tensor, else each tensor's one-line summary
    (a dict's keys one by one, so the rest of an entry such as its text stays readable)."""
    if not any(True for _ in iter_tensors(value)):
        return _short(value, 400)
    if isinstance(value, dict):
        return "; ".join(f"{key!r}: {_value(item)}" for key, item in value.items())
    return summary(value).replace("\n", "; ")


def _answers(answers: list[Any]) -> Any:
    """Per-step answers, a streamed text's characters joined."""
    return "".join(answers) if answers and all(isinstance(a, str) for a in answers) else answers


def _span(steps: list[int]) -> str:
    if not steps:
        return ""
    if steps == list(range(steps[0], steps[-1] + 1)) and len(steps) > 2:
        return f"{steps[0]}-{steps[-1]}"
    return ", ".join(map(str, steps))


def _short(value: Any, width: int = 48) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."
