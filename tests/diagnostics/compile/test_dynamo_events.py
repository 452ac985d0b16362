"""handlerkit.diagnostics.compile.dynamo_events: torch.compile's own records, read into plain facts."""

from __future__ import annotations

import logging
import os

import torch

from handlerkit.diagnostics.compile.dynamo_events import (
    CompiledFrame,
    CountersKept,
    DynamoEvents,
    GraphBreak,
    _frame,
    _trace_logger,
    dynamic_dims,
    graph_breaks,
    recompiles,
    user_frame,
    where,
)

TORCH_FILE = os.path.join(os.path.dirname(torch.__file__), "_dynamo", "symbolic_convert.py")


def test_a_metrics_record_becomes_a_compiled_frame():
    frame = _frame({
        "compile_id": "0/1", "co_name": "torch_dynamo_resume_in_forward_at_13", "co_filename": "model.py",
        "co_firstlineno": 10, "graph_op_count": 4, "entire_frame_compile_time_s": 1.5, "backend_compile_time_s": 1,
        "inductor_compile_time_s": None, "recompile_reason": "size mismatch", "fail_type": None,
        "inductor_fx_local_cache_hit_count": 2, "inductor_fx_local_cache_miss_count": "?",
    })
    assert frame == CompiledFrame("0/1", "forward (resumed at line 13)", "model.py", 10, 4, 1.5, 1.0, None,
                                  "size mismatch", None, 2, None)
    assert frame.is_recompile
    failed = _frame({"compile_id": "0/0", "co_name": "forward", "fail_type": "Unsupported", "fail_reason": "x.item()",
                     "graph_op_count": "n/a"})
    assert failed.failure == "Unsupported: x.item()" and failed.graph_ops is None and not failed.is_recompile
    assert _frame({}).compile_id == "?" and _frame({}).function == "?"


def test_recompiles_are_the_frames_compiled_again():
    frames = [CompiledFrame("0/0", "forward"), CompiledFrame("0/1", "forward", recompile_reason="guard x"),
              CompiledFrame("1/1", "helper")]
    assert [(r.compile_id, r.reason) for r in recompiles(frames)] == [
        ("0/1", "guard x"), ("1/1", "(torch gave no reason)")
    ]


def test_user_frame_is_the_innermost_outside_torch():
    stack = [("handler.py", 3, "a"), ("model.py", 12, "b"), (TORCH_FILE, 900, "torch's own")]
    assert user_frame(stack) == ("model.py", 12, "b")
    assert user_frame([(TORCH_FILE, 1, None)]) == (TORCH_FILE, 1, None)
    assert user_frame([]) is None


def test_graph_breaks_are_deduplicated_with_their_words():
    message = (
        "Unsupported Tensor.item() call\n"
        "  Explanation: Dynamo does not support\n  tensor.item() here\n"
        "  Hint: set capture_scalar_outputs\n"
        "  see https://meta-pytorch.github.io/compile-graph-break-site/gb/gb0124.html"
    )
    raw = {"gb_type": None, "message": message, "stack": [("model.py", 7, "x.item()")], "at": None}
    other = {"gb_type": None, "message": "print() is not supported", "stack": [], "at": ("model.py", 9)}
    [first, second] = graph_breaks([raw, dict(raw), other])
    assert first == GraphBreak(
        reason="Unsupported Tensor.item() call", file="model.py", line=7, source="x.item()",
        explanation="Dynamo does not support", hint="set capture_scalar_outputs", code="GB0124",
        doc_url="https://meta-pytorch.github.io/compile-graph-break-site/gb/gb0124.html", count=2,
    )
    assert (second.reason, second.where, second.count) == ("print() is not supported", "model.py:9", 1)
    assert graph_breaks([]) == []


def test_where_a_place_is():
    assert where("model.py", 7) == "model.py:7" and where("model.py", None) == "model.py" and where(None, 3) == ""


def test_dynamic_dims_from_the_symbols_dynamo_made():
    symbols = ["L['x'].size()[0]", "L['x'].size()[0]", "L['offsets'].size()[0]", "L['x'].stride()[1]"]
    assert dynamic_dims(symbols) == ["x: dim 0", "offsets: dim 0"]


def test_counters_are_put_back_as_they_were():
    from torch._dynamo.utils import counters

    counters["handlerkit_test"]["kept"] = 1
    kept = CountersKept()
    kept.keep()
    counters["handlerkit_test"]["kept"] = 5
    counters["handlerkit_test_new"]["added"] = 1
    same = counters["handlerkit_test"]
    kept.restore()
    assert counters["handlerkit_test"] is same and dict(same) == {"kept": 1}
    assert "handlerkit_test_new" not in counters
    del counters["handlerkit_test"]


def test_a_real_compile_with_a_graph_break_is_caught_and_the_logger_left_as_it_was():
    def breaks_once(x):  # a function of this test alone: Dynamo has no cache for it
        y = x * 2
        print("", end="")  # the graph break
        return y + 1

    logger = _trace_logger()
    level = logger.level
    compiled = torch.compile(breaks_once, backend="eager")
    with DynamoEvents() as events:
        assert torch.equal(compiled(torch.ones(2)), torch.full((2,), 3.0))
    assert logger.level == level and events._collector not in logger.handlers  # torch may add its own
    assert events.frames and events.frames[0].function == "breaks_once"
    [found] = graph_breaks(events.breaks)
    assert found.file is not None and os.path.samefile(found.file, __file__)
    assert found.source == 'print("", end="")  # the graph break'
    assert logging.getLogger("torch.__trace").propagate is False


def cache_record(name: str, frame: int, payload: dict) -> logging.LogRecord:
    import json

    record = logging.LogRecord("torch.__trace", logging.DEBUG, __file__, 1, "", (), None)
    record.metadata = {"artifact": {"name": name, "encoding": "json"}, "frame_id": frame, "frame_compile_id": 0}
    record.payload = json.dumps(payload)
    return record


def test_cache_artifacts_say_per_graph_what_each_cache_did():
    """Inductor writes fx_graph_cache_* and AOTAutograd aotautograd_cache_* artifacts per graph;
    each frame gets its states, a bypass with torch's reason."""
    events = DynamoEvents()
    collector = events._collector
    collector.metrics = [{"compile_id": "0/0", "co_name": "forward"}, {"compile_id": "1/0", "co_name": "helper"},
                         {"compile_id": "2/0", "co_name": "eager_only"}]
    collector.emit(cache_record("fx_graph_cache_hit", 0, {"cache_state": "hit"}))
    collector.emit(cache_record("aotautograd_cache_miss", 0, {"cache_state": "miss"}))
    collector.emit(cache_record("fx_graph_cache_bypass", 1, {"cache_bypass_reason": "Can't cache HigherOrderOperators"}))
    collector.emit(cache_record("aotautograd_cache_bypass", 1, {}))
    collector.emit(cache_record("fx_graph_cache_unknown", 2, {}))  # not a cache state: ignored
    first, second, third = events.frames
    assert (first.fx_graph_cache, first.aot_autograd_cache, first.cache_hit) == ("hit", "miss", True)
    assert second.fx_graph_cache == "bypass: Can't cache HigherOrderOperators" and not second.cache_hit
    assert second.aot_autograd_cache == "bypass: torch gave no reason"
    assert (third.fx_graph_cache, third.aot_autograd_cache) == (None, None)
