"""Programmatic dependent launch (format 1.7, ``LAUNCH_FLAG_PROGRAMMATIC``): the flag's round
trip, dump-replay showing it, the plan refusing flag bits it does not know, and the replay issuing
a flagged launch with CUDA's programmatic stream serialization attribute (without it, and saying
so, on a device before sm_90), on the CPU through a stand-in driver."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from fake_device import DRIVER_DOORS, FakeDriver
from test_host_pace import KERNEL

import replayfmt
from replayfmt.errors import ReplayFormatError
from replayfmt.format import model as m
from replayfmt.replay import Replayer, ReplayOptions
from replayfmt.replay.launches import programmatic_note
from replayfmt.replay.plan import build_plan
from replayfmt.replay.steps import StepKind
from replayfmt.replay.verify_types import VerifyOptions
from replayfmt.verbs import verify
from replayfmt_tools.dump_replay import main as dump_main

PDL = "CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION"


class OlderDriver(FakeDriver):
    """A stand-in driver whose one device is an sm_80 (no programmatic dependent launch)."""

    def cuDeviceGetAttribute(self, attribute: str, device: int) -> tuple[int, int]:
        values = {"CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR": 8, "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR": 0}
        return 0, values.get(attribute, 163 * 1024)


def routed(monkeypatch, driver: FakeDriver) -> FakeDriver:
    for door in DRIVER_DOORS:
        monkeypatch.setattr(f"{door}.driver", lambda: driver)
    return driver


def write(path, flags: list[int]):
    """One launch of kernel ``k`` per entry of ``flags``, each with those flags."""
    with replayfmt.CaptureWriter(path) as w:
        dev = w.add_object(m.Device(name="NVIDIA H100", compute_capability=(9, 0)))
        stream = w.add_object(m.Stream(device=dev))
        x = w.add_object(m.Buffer(size=4096, device=dev))
        exe = w.add_object(m.Executable(functions=(KERNEL,), payload=w.add_payload(b"image")))
        for f in flags:
            w.launch(
                executable=exe,
                function=0,
                grid=(4, 1, 1),
                block=(32, 1, 1),
                parameters=bytes(8),
                relocations=[m.Relocation(0, x, 0, 0)],
                stream=stream,
                flags=f,
            )
    return path


def pdl_attributes(config) -> list[int]:
    return [a.value.programmaticStreamSerializationAllowed for a in config.attrs[: config.numAttrs] if a.id == PDL]


def test_the_flag_round_trips_and_dump_replay_shows_it(tmp_path):
    both = m.LAUNCH_FLAG_PROGRAMMATIC | m.LAUNCH_FLAG_COOPERATIVE
    path = write(tmp_path / "p.kreplay", [m.LAUNCH_FLAG_PROGRAMMATIC, 0, both])
    with replayfmt.open(path) as cap:
        assert [op.flags for op in cap if isinstance(op, m.Launch)] == [4, 0, 5]
    text = CliRunner().invoke(dump_main, ["--kind=launch", str(path)]).stdout.splitlines()
    launches = [line for line in text if line.startswith("op ")]
    assert [line.split("smem=0")[1].split(" params=")[0] for line in launches] == [
        " flags=programmatic",
        "",
        " flags=cooperative,programmatic",
    ]
    rows = CliRunner().invoke(dump_main, ["--format=jsonl", "--kind=launch", str(path)]).stdout.splitlines()
    assert [json.loads(r)["flags"] for r in rows[2:]] == [4, 0, 5]
    with replayfmt.open(Path(__file__).parent / "golden" / "sample-1.6.kreplay") as old:  # 1.6: none flagged so
        assert old.header.minor == 6 and [op.flags for op in old if isinstance(op, m.Launch)] == [0]


def test_the_plan_refuses_a_launch_flag_it_does_not_know_by_number(tmp_path):
    path = write(tmp_path / "u.kreplay", [m.LAUNCH_FLAG_PROGRAMMATIC | 8])
    refused = pytest.raises(ReplayFormatError, match=r"operation \d+ \(launch\): unknown flags 0x8 .*upgrade replayfmt")
    with replayfmt.open(path) as cap, refused:
        build_plan(cap)


def test_the_plan_knows_whether_a_launch_allows_programmatic_dependent_launch(tmp_path):
    with replayfmt.open(write(tmp_path / "p.kreplay", [0, m.LAUNCH_FLAG_PROGRAMMATIC])) as cap:
        plan = build_plan(cap)
        assert plan.programmatic
        assert programmatic_note(plan, 90) == "" and "before sm_90" in programmatic_note(plan, 80)
    with replayfmt.open(write(tmp_path / "n.kreplay", [0, 0])) as cap:
        plan = build_plan(cap)
        assert not plan.programmatic and programmatic_note(plan, 80) == ""


def test_a_flagged_launch_is_issued_with_the_attribute_and_keeps_it_when_reshaped(tmp_path, monkeypatch):
    routed(monkeypatch, FakeDriver({"k": [(0, 8)]}))
    path = write(tmp_path / "p.kreplay", [m.LAUNCH_FLAG_PROGRAMMATIC] * 3 + [0])
    with replayfmt.open(path) as cap, Replayer(build_plan(cap), ReplayOptions()) as r:
        kinds = [s.kind for s in r.steps if s.kind in (StepKind.LAUNCH, StepKind.LAUNCH_EX)]
        assert kinds == [StepKind.LAUNCH_EX] * 3 + [StepKind.LAUNCH]
        flagged = [s for s in r.steps if s.kind is StepKind.LAUNCH_EX]
        shared = flagged[0].args[0]
        assert all(s.args[0] is shared for s in flagged) and pdl_attributes(shared) == [1]
        r.set_launch_shape(flagged[1].operation, (8, 1, 1), (64, 1, 1), 0)  # a copy of the config, PDL kept
        reshaped = [s.args[0] for s in r.steps if s.kind is StepKind.LAUNCH_EX][1]
        assert reshaped is not shared and reshaped.gridDimX == 8 and pdl_attributes(reshaped) == [1]
        assert r.run(1).device_ms == [0.0]


def test_a_device_before_sm_90_runs_flagged_launches_without_the_attribute_and_says_so(tmp_path, monkeypatch):
    routed(monkeypatch, OlderDriver({"k": [(0, 8)]}))
    path = write(tmp_path / "p.kreplay", [m.LAUNCH_FLAG_PROGRAMMATIC, m.LAUNCH_FLAG_PROGRAMMATIC])
    with replayfmt.open(path) as cap, Replayer(build_plan(cap), ReplayOptions()) as r:
        assert [s.kind for s in r.steps if s.kind in (StepKind.LAUNCH, StepKind.LAUNCH_EX)] == [StepKind.LAUNCH] * 2
    lines: list[str] = []
    result = verify(path, VerifyOptions(verify=False), progress=lines.append)
    assert not result.problems, result
    (device,) = [line for line in lines if line.startswith("device ")]
    assert device.endswith("sm_80 (no programmatic dependent launch before sm_90: the launches and graph edges "
                           "that allow it run one kernel after the other, with the same results)")  # fmt: skip


def test_the_python_path_reads_launch_attributes_by_the_c_rings_rule():
    """A null array holds none; a repeated flag is set when any asks for it; the last cluster wins
    (launch_ring.c reads them so: both recorder paths flag a launch alike)."""
    import ctypes
    import struct

    from replayfmt.capture.launch_attributes import PLAIN, LaunchAttributes, launch_attributes

    def attribute(kind: int, value: bytes) -> bytes:
        return struct.pack("<I4x", kind) + value.ljust(64, b"\0")

    rows = [
        attribute(6, struct.pack("<i", 1)),
        attribute(6, struct.pack("<i", 0)),
        attribute(4, struct.pack("<III", 2, 1, 1)),
        attribute(4, struct.pack("<III", 4, 1, 1)),
        attribute(7, struct.pack("<Q", 0xE7)),
    ]
    array = ctypes.create_string_buffer(b"".join(rows), 72 * len(rows))
    attributes, events = launch_attributes(ctypes.addressof(array), len(rows))
    assert attributes == LaunchAttributes((4, 1, 1), cooperative=False, programmatic=True) and events == [0xE7]
    assert launch_attributes(0, 3) == (PLAIN, [])
