"""Where replay places a buffer: near a 4 GiB boundary, at its recorded address modulo 4 GiB."""

import pytest
from fake_device import DRIVER_DOORS, FakeDriver

import replayfmt
from replayfmt.format import model as m
from replayfmt.replay import Replayer, ReplayOptions
from replayfmt.replay.buffers import near_boundary
from replayfmt.replay.plan import build_plan
from replayfmt.writer import CaptureWriter

GIB4 = 1 << 32
BOUNDARY = 0x7F26 * GIB4


@pytest.mark.parametrize(
    ("address", "size", "near"),
    [
        (BOUNDARY, 20 << 20, True),  # starts on one: (small int, 0x7f26) lands inside
        (BOUNDARY - (2 << 20), 2 << 20, True),  # ends on one: (small negative int, 0x7f25) lands inside
        (BOUNDARY - (2 << 20), 4 << 20, True),  # spans one
        (BOUNDARY + (1 << 16), 2 << 20, False),  # starts past the last small int
        (BOUNDARY - (1 << 17), (1 << 16) + 1, False),  # ends at -65536, which is no small int
        (BOUNDARY - (1 << 17), (1 << 16) + 2, True),  # holds -65535
        (BOUNDARY + (1 << 16) - 1, 1, True),  # holds 65535
        (BOUNDARY + (1 << 31) - 16, 32, True),  # holds INT32_MIN beside a stale half
        (BOUNDARY + (1 << 31) + 1, 1 << 20, False),
        (BOUNDARY + (1 << 20), 8 * GIB4, True),  # an arena across several
        (0, 1 << 20, False),  # no recorded address
    ],
)
def test_buffers_near_a_4_gib_boundary_are_found(address, size, near):
    assert near_boundary(address, size) is near


def test_a_replay_places_buffers_near_a_boundary_at_their_recorded_address_modulo_4_gib(tmp_path, monkeypatch):
    """Through the driver's virtual memory calls: a buffer recorded on a boundary, one ending on
    one and one unaligned inside a page near one land at their recorded addresses modulo 4 GiB,
    inside mapped pages; a buffer far from any boundary, and pinned host memory, are allocated
    as before."""
    driver = FakeDriver()
    for door in DRIVER_DOORS:
        monkeypatch.setattr(f"{door}.driver", lambda: driver)
    recorded = {
        "on": (BOUNDARY, 20 << 20),
        "ends": (BOUNDARY - (2 << 20), 2 << 20),
        "unaligned": (BOUNDARY + 0x1200, 0x300),
        "far": (BOUNDARY + (1 << 30), 4 << 20),
    }
    path = tmp_path / "boundary.kreplay"
    with CaptureWriter(path, threads=0) as w:
        dev = w.add_object(m.Device(name="test", compute_capability=(9, 0)))
        ids = {name: w.add_object(m.Buffer(size=size, device=dev, address=a)) for name, (a, size) in recorded.items()}
        pinned = w.add_object(m.Buffer(size=64, device=dev, address=BOUNDARY + 64, memory=m.MemoryKind.HOST_PINNED))
        for bid in (*ids.values(), pinned):
            w.memset(buffer=bid, value=1, count=64)
    with replayfmt.open(path) as cap, Replayer(build_plan(cap), ReplayOptions(check_payloads=False)) as replayer:
        placed = {name: replayer.addresses[bid] for name, bid in ids.items()}
        host = replayer.addresses[pinned]
    for name in ("on", "ends", "unaligned"):
        address, size = recorded[name]
        assert placed[name] % GIB4 == address % GIB4 and placed[name] != address, name
        assert any(start <= placed[name] and placed[name] + size <= start + n for start, n in driver.mapped), name
        assert all(start % (2 << 20) == 0 and n % (2 << 20) == 0 for start, n in driver.mapped)
        assert any(start <= placed[name] and placed[name] + size <= start + n for start, n in driver.reserved), name
    assert len(driver.mapped) == 3 and all(
        any(r <= start and start + n <= r + size for r, size in driver.reserved) for start, n in driver.mapped
    )
    assert placed["far"] % GIB4 != recorded["far"][0] % GIB4  # where the driver put it
    assert host in driver.pinned
    assert sorted(driver.released) == sorted([*driver.mapped, *driver.reserved])  # when the replay closed
