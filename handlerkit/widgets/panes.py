"""What the Stepper puts in its panes, as Jupyter output dicts: no widget code here.

An ``ipywidgets.Output`` holds a tuple of nbformat outputs (``{"output_type":
"display_data", "data": {mime: value}}`` or ``"stream"``). Building those dicts directly, rather
than capturing ``display()`` inside ``with out:``, works the same in a kernel, in a plain
Python test and in the browser, and never starts an IPython shell behind the user's back.
Every HTML part has a ``text/plain`` twin, so tests and terminals read the same content.
"""

from __future__ import annotations

import base64
import html
import io
import json
import sys
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

from handlerkit._text import html_block, html_row, html_table, render_html
from handlerkit.errors import StageError
from handlerkit.summaries import summary

__all__ = [
    "answer_outputs",
    "bundle_output",
    "compile_html",
    "error_output",
    "figure_output",
    "html_output",
    "logs_output",
    "output_text",
    "stream_output",
    "timing_html",
]

PANE_HEIGHT = "480px"  # a Stepper tab's most (it scrolls inside): with the buttons, one 1280x800 screen
_BAR_PX = 220  # the longest timing bar
_ANSWER_CHARS = 1200  # of one request's answer, shown; the result keeps it whole
_ANSWERS_SHOWN = 16  # requests whose answer is shown
_OK, _FAILED = "#4c78a8", "#d62728"


def html_output(markup: str, text: str) -> dict[str, Any]:
    return {"output_type": "display_data", "data": {"text/html": markup, "text/plain": text}, "metadata": {}}


def stream_output(text: str, name: str = "stdout") -> dict[str, Any]:
    return {"output_type": "stream", "name": name, "text": text}


def bundle_output(obj: Any) -> dict[str, Any]:
    """``obj`` as Jupyter shows it: its ``_repr_mimebundle_`` (handlerkit's reports), its
    ``_repr_html_``, else its repr."""
    hook = getattr(obj, "_repr_mimebundle_", None)
    if callable(hook):
        data = hook()
        if isinstance(data, tuple):  # (data, metadata) is allowed by IPython
            data = data[0]
        data = dict(data)
    else:
        data = {}
        markup = getattr(obj, "_repr_html_", None)
        if callable(markup):
            data["text/html"] = markup()
    data.setdefault("text/plain", str(obj) if hasattr(obj, "_summary") else repr(obj))
    return {"output_type": "display_data", "data": data, "metadata": {}}


def figure_output(figure: Any) -> dict[str, Any]:
    """A matplotlib Figure as an ``image/png`` output; the figure is closed afterwards, so a
    notebook clicking through many batches does not keep every figure alive in pyplot."""
    buf = io.BytesIO()
    try:
        figure.savefig(buf, format="png", bbox_inches="tight")
    finally:
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is not None:  # only figures made through pyplot are registered there
            pyplot.close(figure)
    png = base64.b64encode(buf.getvalue()).decode("ascii")
    width, height = (int(v) for v in figure.get_size_inches() * figure.dpi)
    return {
        "output_type": "display_data",
        "data": {"image/png": png, "text/plain": f"<Figure size {width}x{height}>"},
        "metadata": {},
    }


def picture_output(obj: Any) -> dict[str, Any]:
    """``obj`` drawn by :func:`handlerkit.viz.show`, or a grey note saying why it could not be
    (a picture that cannot be drawn must not hide the rest of a pane)."""
    try:
        from handlerkit import viz

        shown = viz.show(obj)
        if hasattr(shown, "_repr_mimebundle_"):  # some of it is HTML (a token table): a viz.shown.Shown
            return html_output(shown._repr_html_(), repr(shown))
        return figure_output(shown)
    except Exception as exc:
        message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        return html_output(
            f"<div style='color:#777'>no picture: {html.escape(message)}</div>", f"no picture: {message}"
        )


def answer_outputs(answer: Any, *, pictures: bool = True) -> list[dict[str, Any]]:
    """The answer each request gets (``postprocess``'s list, one item per request), as the
    worker sends it: a ``str`` as is, anything else as JSON; a ``bytes`` answer (a filter's
    PNG) by its size, then drawn by :func:`picture_output` when ``pictures``.

    Shown in place of a picture of the postprocess output, which would redraw inference's.
    """
    items = list(enumerate(answer)) if isinstance(answer, list) else [(None, answer)]
    title = f"answer: what each of {len(items)} request(s) gets" if isinstance(answer, list) else "answer"
    parts, text, drawn = [f"<div><b>{html.escape(title)}</b></div>"], [title], []
    for index, item in items[:_ANSWERS_SHOWN]:
        label = "" if index is None else f"request {index}: "
        body = _answer_text(item)
        if isinstance(item, (bytes, bytearray)) and pictures:
            drawn.append(item)
        parts.append(
            f"<div style='margin-top:4px'><b>{html.escape(label)}</b>"
            f"<pre style='white-space:pre-wrap;word-break:break-word;margin:0'>{html.escape(body)}</pre></div>"
        )
        text.append(f"{label}{body}")
    if len(items) > _ANSWERS_SHOWN:
        more = f"… and {len(items) - _ANSWERS_SHOWN} more request(s): h.results['postprocess'].output holds them all"
        parts.append(f"<div style='color:#777'>{html.escape(more)}</div>")
        text.append(more)
    return [html_output("".join(parts), "\n".join(text)), *(picture_output(item) for item in drawn)]


def _answer_text(item: Any) -> str:
    if isinstance(item, (bytes, bytearray)):
        from handlerkit.cli.run import describe_bytes  # one description of a bytes answer, the CLI's

        return describe_bytes(bytes(item))
    if isinstance(item, str):
        text = item
    else:
        try:
            text = json.dumps(item, ensure_ascii=False)
        except (TypeError, ValueError):  # not JSON (a tensor): the harness's contract check says so
            text = summary(item)
    if len(text) > _ANSWER_CHARS:
        return f"{text[:_ANSWER_CHARS]}… ({len(text)} characters)"
    return text


def error_output(stage: str, exc: BaseException, *, unexpected: bool = False) -> dict[str, Any]:
    """A failed stage: what went wrong (a StageError's message names the handler's line), and
    the fix in its own line.

    ``unexpected``: an exception that is not handlerkit's (a bug, in the handler or in the
    Stepper), shown with its traceback since nothing better is known about it.
    """
    message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
    fix = getattr(exc, "fix", None)
    if isinstance(exc, StageError):  # its message says already that the stage failed, and where
        text = [message]
        title, _, details = message.partition("\n")
    else:
        text = [f"{stage} failed: {message}"]
        title, details = f"{stage} failed", message
    parts = [f"<div style='border-left:4px solid {_FAILED};padding:4px 8px'>", f"<b>{html.escape(title)}</b>"]
    if details:
        parts.append(f"<pre style='white-space:pre-wrap;margin:4px 0'>{html.escape(details)}</pre>")
    if fix:
        text.append(f"  fix: {fix}")
        parts.append(f"<div><b>fix:</b> {html.escape(fix)}</div>")
    if unexpected:
        trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        text.append(trace.rstrip())
        parts.append(f"<pre style='white-space:pre-wrap;font-size:85%'>{html.escape(trace)}</pre>")
    parts.append("</div>")
    return html_output("".join(parts), "\n".join(text))


def logs_output(logs: Sequence[Any], caught: Sequence[Any]) -> dict[str, Any] | None:
    """Every log record and warning of a stage (the StageResult's table shows the first five).

    ``caught`` holds ``warnings.WarningMessage`` s: the stage's own and those the harness
    raised about its output (contract problems).
    """
    if not logs and not caught:
        return None
    rows = [("log", f"{e.level} {e.logger}", e.message) for e in logs]
    rows += [("warning", w.category.__name__, str(w.message)) for w in caught]
    text = "\n".join(f"{kind}: {who}: {what}" for kind, who, what in rows)
    title = f"logs and warnings ({len(logs)} log record(s), {len(caught)} warning(s))"
    markup = render_html(("", "", ""), rows, title)
    return html_output(markup, f"{title}\n{text}")


def timing_html(times: Mapping[str, tuple[float, bool]]) -> str:
    """Per-stage wall time as horizontal bars, scaled to the slowest stage shown.

    ``times``: stage → (wall ms, ok), in display order; stages that have not run are left out.
    """
    if not times:
        return "<div style='color:#777'>timings: no stage has run yet</div>"
    slowest = max(ms for ms, _ in times.values()) or 1.0
    rows = []
    for stage, (ms, ok) in times.items():
        width = max(1, round(_BAR_PX * ms / slowest))
        color = _OK if ok else _FAILED
        bar = f"<td style='width:{_BAR_PX + 10}px'><div style='background:{color};height:10px;width:{width}px'></div></td>"
        cells = (
            html_row([stage]).removesuffix("</tr>") + bar + html_row([ms, "" if ok else "failed"]).removeprefix("<tr>")
        )
        rows.append(cells)
    return html_block(html_table(rows, "wall time (ms)"))


def compile_html(decision: Any) -> str:
    """The handler's compile decision (``decisions.compile``): asked, applied, why."""
    if decision is None:
        return (
            "<div style='color:#777'>this handler records no compile decision (not a handlerkit "
            "BaseHandler, or initialize has not run); the report below still compiles the model</div>"
        )
    fields = ("requested", "schema", "options", "applied", "reason", "error", "fell_back_at_runtime")
    rows = [
        (name, str(getattr(decision, name))) for name in fields if getattr(decision, name, None) not in (None, {}, "")
    ]
    return render_html(("", ""), rows, "compile decision")


def output_text(outputs: Sequence[Mapping[str, Any]]) -> str:
    """The text of an Output widget's outputs (streams and ``text/plain``), for tests and logs."""
    parts = []
    for out in outputs:
        if out.get("output_type") == "stream":
            parts.append(str(out.get("text", "")))
        else:
            parts.append(str(out.get("data", {}).get("text/plain", "")))
    return "\n".join(parts)
