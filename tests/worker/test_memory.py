"""Tests for handlerkit.worker.memory: real peaks on this machine, fallbacks, faked CUDA."""

from __future__ import annotations

import json
import sys
import time

import pytest

from handlerkit.worker import devices as device_mod
from handlerkit.worker import memory
from handlerkit.worker.memory import MemoryTracker, cpu_method, format_bytes, rss_bytes

torch = pytest.importorskip("torch")

SIZE = 200 * 10**6  # bytes of the transient tensor
linux_vmhwm = pytest.mark.skipif(cpu_method() != "vmhwm", reason="needs a writable /proc/self/clear_refs")
has_rss = pytest.mark.skipif(rss_bytes() is None, reason="process RSS cannot be read here")


def _transient(hold_s: float = 0.0) -> None:
    """Allocate SIZE bytes in a torch tensor (pages touched), hold it, free it."""
    t = torch.ones(SIZE // 4, dtype=torch.float32)
    if hold_s:
        time.sleep(hold_s)
    del t


@pytest.fixture
def best_method_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget the cached method so a test can make cpu_method() decide again."""
    monkeypatch.setattr(memory, "_best_method", None)


# --- helpers -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (None, "n/a"),
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (12_900_000, "12.3 MiB"),
        (3 * 2**30, "3.0 GiB"),
        (-5 * 2**20, "-5.0 MiB"),
        (2**50, "1024.0 TiB"),
    ],
)
def test_format_bytes(n: int | None, text: str) -> None:
    assert format_bytes(n) == text


@has_rss
def test_rss_bytes_sees_a_held_allocation() -> None:
    before = rss_bytes()
    t = torch.ones(SIZE // 4)
    during = rss_bytes()
    del t
    assert before is not None and during is not None
    assert during - before >= 0.9 * SIZE


# --- VmHWM (the preferred method) ------------------------------------------------------------


@linux_vmhwm
def test_vmhwm_catches_a_transient_allocation_freed_inside_the_block() -> None:
    with MemoryTracker() as m:
        _transient()
    assert m.method == "vmhwm"
    assert m.cpu_start_bytes is not None and m.cpu_end_bytes is not None and m.cpu_peak_bytes is not None
    assert m.cpu_peak_delta_bytes is not None and m.cpu_peak_delta_bytes >= 0.9 * SIZE
    # The tensor is gone by the end: the peak is well above where the block ended.
    assert m.cpu_peak_bytes - m.cpu_end_bytes >= 0.9 * SIZE
    assert m.cuda_peak_bytes is None and m.cuda_start_bytes is None


@linux_vmhwm
def test_vmhwm_is_reset_per_block() -> None:
    _transient()  # raises the process's lifetime high-water mark
    with MemoryTracker() as m:
        pass
    # Without the clear_refs reset the block would report the earlier peak.
    assert m.cpu_peak_delta_bytes is not None and m.cpu_peak_delta_bytes < SIZE // 4


@linux_vmhwm
def test_the_quick_peak_read_is_used_only_above_the_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    """getrusage's ru_maxrss is max(a floor fixed at exec, VmHWM): a tracker takes it only above
    the floor's known bound; a floor above (a process spawned by a bigger one) sends it back to
    /proc/self/status, and the peak is right either way."""
    status_reads = []
    real_status, real_maxrss = memory._hwm_and_rss, memory._maxrss
    monkeypatch.setattr(memory, "_hwm_and_rss", lambda: status_reads.append(1) or real_status())
    with MemoryTracker(end=False) as quick:
        _transient()
    assert status_reads == [] and quick.cpu_end_bytes is None  # the floor's bound was learnt small
    assert quick.cpu_peak_delta_bytes is not None and 0.9 * SIZE <= quick.cpu_peak_delta_bytes < 2 * SIZE
    floor = 64 * 2**40  # a floor above anything this process will ever hold
    monkeypatch.setattr(memory, "_maxrss", lambda: max(floor, real_maxrss()))
    monkeypatch.setattr(memory, "_floor_at_most", float("inf"))
    with MemoryTracker() as careful:
        _transient()
    assert status_reads == [1] and memory._floor_at_most == floor
    assert careful.cpu_peak_bytes is not None and careful.cpu_peak_bytes < floor
    assert careful.cpu_peak_delta_bytes is not None and 0.9 * SIZE <= careful.cpu_peak_delta_bytes < 2 * SIZE
    with MemoryTracker() as idle:  # and no transient is invented where there was none
        pass
    assert idle.cpu_peak_delta_bytes is not None and idle.cpu_peak_delta_bytes < SIZE // 4
    assert idle.cpu_end_bytes is not None and abs(idle.cpu_end_bytes - idle.cpu_start_bytes) < SIZE // 4


@linux_vmhwm
def test_nested_trackers_keep_the_outer_peak() -> None:
    with MemoryTracker() as outer:
        _transient()  # freed before the inner tracker resets the high-water mark
        with MemoryTracker() as inner:
            pass
    assert inner.cpu_peak_delta_bytes is not None and inner.cpu_peak_delta_bytes < SIZE // 4
    assert outer.cpu_peak_delta_bytes is not None and outer.cpu_peak_delta_bytes >= 0.9 * SIZE
    assert memory._active == []


@linux_vmhwm
def test_tracker_measures_and_propagates_when_the_block_raises() -> None:
    with pytest.raises(ZeroDivisionError):
        with MemoryTracker() as m:
            _transient()
            1 / 0  # noqa: B018
    assert m.cpu_peak_delta_bytes is not None and m.cpu_peak_delta_bytes >= 0.9 * SIZE
    assert memory._active == []


# --- sampling fallback -----------------------------------------------------------------------


@has_rss
def test_sampling_catches_a_transient_allocation_held_50ms() -> None:
    with MemoryTracker(method="sampling") as m:
        _transient(hold_s=0.05)
    assert m.method == "sampling"
    assert m.cpu_peak_delta_bytes is not None and m.cpu_peak_delta_bytes >= 0.9 * SIZE
    assert m.cpu_end_bytes is not None and m.cpu_peak_bytes is not None
    assert m.cpu_peak_bytes - m.cpu_end_bytes >= 0.9 * SIZE
    assert m._sampler is None  # the thread was stopped and joined


@has_rss
def test_falls_back_to_sampling_when_clear_refs_is_refused(
    monkeypatch: pytest.MonkeyPatch, best_method_reset: None
) -> None:
    def refuse() -> None:
        raise PermissionError(13, "Permission denied", "/proc/self/clear_refs")

    monkeypatch.setattr(memory, "_reset_hwm", refuse)
    assert cpu_method() == "sampling"
    with pytest.raises(ValueError, match="clear_refs"):
        MemoryTracker(method="vmhwm")
    with MemoryTracker() as m:
        _transient(hold_s=0.05)
    assert m.method == "sampling"
    assert m.cpu_peak_delta_bytes is not None and m.cpu_peak_delta_bytes >= 0.9 * SIZE


def test_unavailable_without_proc_or_psutil(monkeypatch: pytest.MonkeyPatch, best_method_reset: None) -> None:
    monkeypatch.setattr(memory, "_LINUX", False)
    monkeypatch.setitem(sys.modules, "psutil", None)  # makes `import psutil` fail
    assert rss_bytes() is None
    assert cpu_method() == "unavailable"
    with MemoryTracker() as m:
        pass
    assert m.method == "unavailable"
    assert m.cpu_peak_bytes is None and m.cpu_peak_delta_bytes is None
    assert "unavailable" in repr(m)


def test_unknown_method_is_rejected() -> None:
    with pytest.raises(ValueError, match="method must be 'vmhwm', 'sampling' or 'unavailable': got 'rss'"):
        MemoryTracker(method="rss")


# --- disabled ------------------------------------------------------------------------------


def test_disabled_tracker_touches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("a disabled tracker must not measure")

    for name in ("_read", "_reset_hwm", "rss_bytes", "cpu_method"):
        monkeypatch.setattr(memory, name, forbidden)
    monkeypatch.setattr(device_mod, "cuda_available", forbidden)
    with MemoryTracker("cuda:0", enabled=False) as m:
        pass
    assert m.method == "disabled"
    assert all(v is None for k, v in m.to_dict().items() if k not in ("method", "device"))


# --- CUDA with fakes -----------------------------------------------------------------------


class _FakeAllocator:
    """torch.cuda's allocator statistics, per device, driven by the test."""

    def __init__(self) -> None:
        self.allocated: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.calls: list[tuple[str, object]] = []

    def alloc(self, device: str, n: int) -> None:
        self.allocated[device] = self.allocated.get(device, 0) + n
        self.peak[device] = max(self.peak.get(device, 0), self.allocated[device])

    def free(self, device: str, n: int) -> None:
        self.allocated[device] -= n

    def reset_peak_memory_stats(self, device: object = None) -> None:
        self.calls.append(("reset", device))
        self.peak[str(device)] = self.allocated.get(str(device), 0)

    def max_memory_allocated(self, device: object = None) -> int:
        self.calls.append(("max", device))
        return self.peak.get(str(device), 0)

    def memory_allocated(self, device: object = None) -> int:
        self.calls.append(("allocated", device))
        return self.allocated.get(str(device), 0)


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> _FakeAllocator:
    fake = _FakeAllocator()
    monkeypatch.setattr(device_mod, "cuda_available", lambda: True)
    for name in ("reset_peak_memory_stats", "max_memory_allocated", "memory_allocated"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    return fake


def test_cuda_peak_plumbing(fake_cuda: _FakeAllocator) -> None:
    fake_cuda.alloc("cuda:0", 1000)
    fake_cuda.alloc("cuda:0", 9000)
    fake_cuda.free("cuda:0", 9000)  # an old peak of 10000 the block must not report
    with MemoryTracker("cuda:0") as m:
        fake_cuda.alloc("cuda:0", 5000)
        fake_cuda.free("cuda:0", 4000)
    assert fake_cuda.calls[:2] == [("reset", "cuda:0"), ("allocated", "cuda:0")]
    assert ("max", "cuda:0") in fake_cuda.calls[2:]
    assert m.cuda_start_bytes == 1000
    assert m.cuda_peak_bytes == 6000
    assert m.cuda_end_bytes == 2000
    assert m.cuda_peak_delta_bytes == 5000
    assert "cuda_peak=5.9 KiB" in repr(m)
    d = json.loads(json.dumps(m.to_dict()))
    assert d["device"] == "cuda" and d["cuda_peak_delta_bytes"] == 5000


def test_cuda_nested_trackers_keep_the_outer_peak(fake_cuda: _FakeAllocator) -> None:
    with MemoryTracker("cuda:0") as outer:
        fake_cuda.alloc("cuda:0", 8000)
        fake_cuda.free("cuda:0", 8000)
        with MemoryTracker("cuda:0") as inner:  # resets the device's peak statistics
            fake_cuda.alloc("cuda:0", 100)
    assert inner.cuda_peak_delta_bytes == 100
    assert outer.cuda_peak_delta_bytes == 8000


def test_cuda_untouched_when_not_available_or_not_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: object) -> int:
        raise AssertionError("CUDA statistics must not be read")

    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", forbidden)
    monkeypatch.setattr(device_mod, "cuda_available", lambda: False)
    with MemoryTracker("cuda") as m:
        pass
    assert m.cuda_peak_bytes is None
    monkeypatch.setattr(device_mod, "cuda_available", lambda: True)
    with MemoryTracker("cpu") as m:
        pass
    assert m.cuda_peak_bytes is None and m.cuda_start_bytes is None


def test_proc_descriptors_are_reopened_after_fork():
    # /proc/self is resolved when a file is opened: a forked child must read its own entries,
    # not the ones behind descriptors inherited from its parent.
    import os

    from handlerkit.worker import memory as mem

    if mem.cpu_method() != "vmhwm":
        pytest.skip("VmHWM method not available here")
    mem.rss_bytes()  # the parent opens its descriptors
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        block = bytearray(200 * 2**20)  # the child grows; the parent does not
        for i in range(0, len(block), 4096):
            block[i] = 1
        with open(f"/proc/{os.getpid()}/statm") as f:
            own = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        os.write(write_end, f"{mem.rss_bytes()} {own}".encode())
        os._exit(0)
    os.close(write_end)
    via_module, own = map(int, os.read(read_end, 64).split())
    os.waitpid(pid, 0)
    parent = mem.rss_bytes()
    if abs(own - parent) < 32 * 2**20:
        pytest.skip("the child's RSS happens to equal the parent's; the test cannot tell them apart")
    assert abs(via_module - own) < 8 * 2**20  # the child's own entry, not the parent's
