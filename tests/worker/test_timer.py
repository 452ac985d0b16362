"""handlerkit.worker.timer: wall and device time, on CPU and on faked accelerators."""

from __future__ import annotations

import time

import pytest

from handlerkit.worker import devices as device_mod
from handlerkit.worker import timer as timing
from handlerkit.worker.timer import Timer

# --- Timer on CPU ------------------------------------------------------------------------


def test_timer_measures_a_sleep_on_cpu() -> None:
    with Timer() as t:
        time.sleep(0.02)
    assert t.wall_ms is not None and t.wall_ms >= 20.0
    assert t.device_ms is None
    assert t.synchronized is False
    assert t.kind == "cpu"


def test_timer_orders_a_short_and_a_long_block() -> None:
    with Timer() as short:
        pass
    with Timer() as long:
        time.sleep(0.01)
    assert short.wall_ms is not None and long.wall_ms is not None
    assert short.wall_ms < long.wall_ms


def test_timer_start_stop_and_reuse() -> None:
    t = Timer("cpu")
    t.start()
    time.sleep(0.005)
    first = t.stop()
    assert first >= 5.0 and t.wall_ms == first
    with t:
        pass
    assert t.wall_ms is not None and t.wall_ms < first


def test_timer_records_time_and_propagates_an_exception() -> None:
    t = Timer()
    with pytest.raises(KeyError):
        with t:
            time.sleep(0.005)
            raise KeyError("boom")
    assert t.wall_ms is not None and t.wall_ms >= 5.0


# --- Timer with a faked accelerator ---------------------------------------------------------


class _FakeEvent:
    """Stands in for torch.cuda.Event: records into a shared log."""

    log: list[str] = []

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing, "Timer must ask for timing events"
        self.recorded = False

    def record(self, stream: object = None) -> None:
        self.recorded = True
        _FakeEvent.log.append("record")

    def elapsed_time(self, end: _FakeEvent) -> float:
        assert self.recorded and end.recorded
        return 7.5


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A CUDA machine: available, with synchronize and Event faked through torch.cuda."""
    torch = pytest.importorskip("torch")
    log: list[str] = []
    _FakeEvent.log = log
    monkeypatch.setattr(device_mod, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append(f"sync:{device}"))
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    return log


def test_timer_synchronizes_cuda_before_and_after(fake_cuda: list[str]) -> None:
    with Timer("cuda:0") as t:
        fake_cuda.append("body")
    assert fake_cuda == ["sync:cuda:0", "record", "body", "record", "sync:cuda:0"]
    assert t.synchronized is True
    assert t.device_ms == 7.5
    assert t.wall_ms is not None and t.wall_ms >= 0


def test_device_time_else_wall_time(fake_cuda: list[str]) -> None:
    """The one rule the reports and ``ts_handler_<stage>`` metrics share: device time where the
    device was timed, else wall time (``StageResult.device_or_wall_ms``: test_results.py)."""
    assert Timer().device_or_wall_ms is None  # not run yet
    with Timer("cuda:0") as on_device:
        pass
    assert on_device.device_or_wall_ms == 7.5 != on_device.wall_ms
    with Timer() as on_cpu:
        pass
    assert on_cpu.device_or_wall_ms == on_cpu.wall_ms is not None
    failed = Timer("cuda")
    with pytest.raises(RuntimeError):
        with failed:
            raise RuntimeError("kernel failed")
    assert failed.device_or_wall_ms == failed.wall_ms is not None  # no device time for a failed block


def test_timer_skips_closing_sync_when_the_block_raises(fake_cuda: list[str]) -> None:
    t = Timer("cuda")
    with pytest.raises(RuntimeError, match="kernel failed"):
        with t:
            fake_cuda.append("body")
            raise RuntimeError("kernel failed")
    assert fake_cuda == ["sync:cuda", "record", "body"]
    assert t.synchronized is False and t.device_ms is None and t.wall_ms is not None


def test_timer_uses_the_sync_seam(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, object]] = []
    monkeypatch.setattr(device_mod, "cuda_available", lambda: True)
    monkeypatch.setattr(timing, "synchronize", lambda kind, device=None: calls.append((kind, device)))
    monkeypatch.setattr(timing, "_timing_events", lambda kind: None)  # a backend without events
    with Timer("cuda:1") as t:
        time.sleep(0.005)
    assert calls == [("cuda", "cuda:1"), ("cuda", "cuda:1")]
    # Without events the device time is the synchronised wall time.
    assert t.synchronized and t.device_ms == t.wall_ms and t.wall_ms is not None and t.wall_ms >= 5.0


def test_timer_does_not_sync_an_unavailable_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_sync(kind: str, device: object = None) -> None:
        raise AssertionError("synchronize must not be called without CUDA")

    monkeypatch.setattr(device_mod, "cuda_available", lambda: False)
    monkeypatch.setattr(timing, "synchronize", no_sync)
    with Timer("cuda") as t:
        pass
    assert t.synchronized is False and t.device_ms is None


@pytest.mark.parametrize(("kind", "seam"), [("xpu", "xpu_available"), ("mps", "mps_available")])
def test_timer_synchronizes_xpu_and_mps(monkeypatch: pytest.MonkeyPatch, kind: str, seam: str) -> None:
    torch = pytest.importorskip("torch")
    log: list[str] = []
    monkeypatch.setattr(device_mod, seam, lambda: True)
    module = getattr(torch, kind)
    if kind == "mps":
        monkeypatch.setattr(module, "synchronize", lambda: log.append("sync"))
    else:
        monkeypatch.setattr(module, "synchronize", lambda device=None: log.append("sync"))
    _FakeEvent.log = log
    monkeypatch.setattr(module, "Event", _FakeEvent)
    with Timer(kind) as t:
        log.append("body")
    assert log == ["sync", "record", "body", "record", "sync"]
    assert t.synchronized and t.device_ms == 7.5


