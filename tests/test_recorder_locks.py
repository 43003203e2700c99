"""The recorder's two lock helpers the translator is handed: ``settled`` (a framework's block free
checkpoints after the launches the C ring holds) and ``unlocked`` (a wait for a collective lets
other threads' callbacks run). Exercised on a Recorder whose CUPTI source is a fake, on the CPU."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from replayfmt.capture.recorder import Recorder


class FakeSource:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.devices = SimpleNamespace(forget=lambda: self.calls.append("forget"))

    def settle(self) -> None:
        self.calls.append("settle")


def recorder() -> tuple[Recorder, FakeSource]:
    r = Recorder.__new__(Recorder)  # no CUPTI: only what the two helpers use
    r.times = SimpleNamespace(lock=threading.RLock())
    source = FakeSource()
    r.source = source
    return r, source


def held_elsewhere(lock) -> bool:
    """Whether another thread could not take ``lock`` now."""
    took: list[bool] = []
    other = threading.Thread(target=lambda: took.append(lock.acquire(timeout=0.3) and (lock.release() or True)))
    other.start()
    other.join(timeout=10)
    return not took[0]


def test_settled_holds_the_source_lock_after_settling_the_ring():
    r, source = recorder()
    with r._settled():
        assert source.calls == ["settle"]
        assert held_elsewhere(r.times.lock)
    assert not held_elsewhere(r.times.lock)


def test_source_unlocked_lets_another_thread_take_the_lock_and_forgets_the_device():
    r, source = recorder()
    with r.times.lock, r.times.lock:  # the callback's hold, and again around the translator
        with r._source_unlocked():
            assert not held_elsewhere(r.times.lock)
        assert source.calls == ["forget"]
        assert held_elsewhere(r.times.lock)  # taken again as deep
