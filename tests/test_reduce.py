"""reduce-replay without a GPU: the ddmin core on synthetic tests, candidates of a real written
capture (closure, inputs rebuilt from the capture's data, checkpoints narrowed, run-replay
--dry-run's plan), a reduction under a real --command test (a child process running dump-replay),
an interrupt, provenance, and the CLI's refusals."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from edit_captures import step_capture

import replayfmt
from replayfmt.edit.ddmin import ddmin, split
from replayfmt.edit.extract import file_digest
from replayfmt.edit.reduce import OriginalPasses, ReduceOptions, reduce
from replayfmt.edit.reduce_build import NotBuildable, Piece, Reducible
from replayfmt.edit.reduce_tests import Answer, AsCaptured, Command, FailsVerify, Faults, decode_test, encode_test
from replayfmt.execute import open_replay
from replayfmt.format import model as m
from replayfmt.replay.devices import environment_ok
from replayfmt_tools.reduce_replay import main as reduce_main

_K = m.OperationKind
GREP_GATHER = "dump-replay {} | grep -q 'launch  *gather' && exit 1; exit 0"


# -- the ddmin core -----------------------------------------------------------------------------


def counting(predicate):
    calls = []

    def test(batch):
        calls.extend(batch)
        return [predicate(set(c)) for c in batch]

    return test, calls


def test_ddmin_finds_one_culprit_in_few_tests():
    test, calls = counting(lambda c: 37 in c)
    s = ddmin(list(range(100)), test)
    assert s.best == [37] and not s.exhausted
    assert len(calls) <= 2 * math.ceil(math.log2(100)) + 2  # halving: two halves a round at most
    assert s.tests == len(calls)


def test_ddmin_result_is_one_minimal_for_interacting_items():
    needed = {3, 41, 77}
    test, calls = counting(lambda c: needed <= c)
    s = ddmin(list(range(90)), test)
    assert set(s.best) == needed
    for x in s.best:  # 1-minimal: taking any one item away passes
        assert not needed <= set(s.best) - {x}
    assert len(calls) <= 90 * 3  # well under the quadratic worst case
    assert len({tuple(c) for c in calls}) == len(calls)  # never the same candidate twice


def test_ddmin_batches_find_what_one_at_a_time_finds():
    predicate = lambda c: {5, 6} <= c or {60} <= c  # noqa: E731
    one, _ = counting(predicate)
    four, _calls = counting(predicate)
    assert ddmin(list(range(64)), four, batch=4).best == ddmin(list(range(64)), one).best


def test_ddmin_stops_on_its_budget_with_a_failing_best():
    test, calls = counting(lambda c: {10, 50} <= c)
    s = ddmin(list(range(64)), test, budget=lambda: len(calls) < 3)
    assert s.exhausted and {10, 50} <= set(s.best) and len(calls) == 3


def test_split_keeps_order_and_every_item():
    chunks = split(list(range(10)), 3)
    assert chunks == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert split([1], 4) == [[1]]


# -- candidates of a real capture ----------------------------------------------------------------


@pytest.fixture
def step(tmp_path, cubin):
    path = tmp_path / "step.kreplay"
    return path, step_capture(path, cubin)


def read(path):
    with replayfmt.open(path) as cap:
        ops = list(cap)
        labels = {o.id: o.label for o in cap.objects()}
        states = {labels[op.buffer]: cap.read_payload(op.payload) for op in ops if op.kind == _K.STATE}
        uploads = [
            (labels[op.dst_buffer], cap.read_payload(op.payload)) for op in ops if op.kind == _K.COPY_HOST_TO_DEVICE
        ]
        checks = [
            {labels[e.buffer]: cap.read_payload(e.payload) for e in op.entries}
            for op in ops
            if op.kind == _K.CHECKPOINT
        ]
        return ops, states, uploads, checks, dict(cap.metadata.properties)


def test_a_kept_launch_gets_the_inputs_its_removed_producers_left(step, tmp_path):
    path, e = step
    with replayfmt.open(path) as cap:
        built = Reducible(cap, path).build([e.ops["saxpy1"]], tmp_path / "c.kreplay")
    ops, states, uploads, checks, _ = read(built.path)
    assert [op.kind for op in ops if op.kind in m.DEVICE_WORK] == [_K.LAUNCH]
    # y = saxpy0's output and z = gather's, both known from the scopes' checkpoints
    assert states["y"] == e.data["Y1"].tobytes() and states["z"] == e.data["Z2"].tobytes()
    assert not uploads
    # compared only on what the kept launch wrote: y after it (the step's checkpoint)
    assert checks[-1]["y"] == e.data["Y3"].tobytes()


def test_bytes_given_again_between_kept_launches_are_copies(step, tmp_path):
    path, e = step
    with replayfmt.open(path) as cap:
        built = Reducible(cap, path).build([e.ops["saxpy0"], e.ops["saxpy1"]], tmp_path / "c.kreplay")
    _ops, states, uploads, _checks, _ = read(built.path)
    assert states["y"] == e.data["Y0"].tobytes()  # before saxpy0, as the step's state says
    # nothing kept touched z before saxpy1: starting state; y was saxpy0's, then the removed gather
    # (which names y in its pointer table, so may have written it): a copy just before saxpy1
    assert states["z"] == e.data["Z2"].tobytes()
    assert uploads == [("y", e.data["Y1"].tobytes())]
    assert {p.before for p in built.pieces} == {e.ops["saxpy0"], e.ops["saxpy1"]}


def test_a_candidate_needing_bytes_the_capture_lacks_is_not_built(tmp_path, cubin):
    path = tmp_path / "bare.kreplay"
    e = step_capture(path, cubin, checkpoints=False)
    with replayfmt.open(path) as cap:
        r = Reducible(cap, path)
        with pytest.raises(NotBuildable, match=f"removed operation {e.ops['saxpy0']}"):
            r.build([e.ops["gather"]], tmp_path / "c.kreplay")  # reads y, which only saxpy0's launch wrote
        r.build([e.ops["saxpy0"], e.ops["copy"], e.ops["gather"]], tmp_path / "d.kreplay")  # its producer kept


def test_dropped_pieces_leave_holes_in_the_state(step, tmp_path):
    path, e = step
    with replayfmt.open(path) as cap:
        r = Reducible(cap, path)
        full = r.build([e.ops["saxpy1"]], tmp_path / "a.kreplay")
        z = next(p for p in full.pieces if p.size == 1024)
        half = Piece(z.before, z.buffer, 0, 512)
        less = r.build([e.ops["saxpy1"]], tmp_path / "b.kreplay", dropped=[half])
    assert less.state_bytes == full.state_bytes - 512


def dry_run_ok(path: Path) -> bool:
    with open_replay(path) as session:
        return not session.plan.problems


def test_every_candidate_plans_and_the_reduction_keeps_the_gather(step, tmp_path):
    """A runner in this process: every candidate must plan (run-replay --dry-run's plan), and the
    test is 'a gather launch is there'."""
    path, e = step
    seen = []

    def runner(test, candidate, device, timeout):
        assert dry_run_ok(candidate), candidate
        with replayfmt.open(candidate) as cap:
            names = {f.name for o in cap.objects() if isinstance(o, m.Executable) for f in o.functions}
            launches = [op for op in cap if op.kind == _K.LAUNCH]
            found = any(cap.object(op.executable).functions[op.function].name == "gather" for op in launches)
        seen.append((len(launches), names))
        return Answer(found, "gather" if found else "no gather")

    out = tmp_path / "small.kreplay"
    result = reduce(path, out, Command("true {}"), ReduceOptions(devices=(None,)), runner=runner)
    assert result.kept == (e.ops["gather"],) and result.written
    assert len(seen) == result.replays and result.replays >= 4
    assert result.launches_before == 4 and result.launches_after == 1 and result.work_before == 10
    assert dry_run_ok(out)
    lines = str(result)
    assert lines.splitlines() == result.lines()
    assert "launches 4 -> 1" in lines and f"{result.replays} tried" in lines


def test_reduce_under_a_real_command_test_and_its_provenance(step, tmp_path):
    path, e = step
    out = tmp_path / "small.kreplay"
    lines = []
    result = reduce(path, out, Command(GREP_GATHER), ReduceOptions(devices=(None,)), progress=lines.append)
    assert result.kept == (e.ops["gather"],)
    ops, states, _uploads, _checks, props = read(out)
    assert [op.kind for op in ops if op.kind in m.DEVICE_WORK] == [_K.LAUNCH]
    if environment_ok() is not None:  # no GPU to verify candidates on: no byte is known unread, all stay
        assert result.inputs_kept.startswith("no GPU to check") and "inputs       all kept: no GPU" in str(result)
        assert result.given_bytes == result.given_bytes_first > 0 and states
    assert props["reduce.source_digest"] == file_digest(path)
    assert props["reduce.operations_kept"] == str(e.ops["gather"])
    assert props["reduce.test"] == Command(GREP_GATHER).describe()
    assert props["reduce.source"] == str(path.resolve())
    assert lines and all(line.startswith(("operations:", "inputs:")) for line in lines)


def _gather_inputs(cap) -> dict[str, bytes | None]:
    """What the capture's gather launch is given of the tables, indices, x and y it reads (not z,
    which it writes whole), by label: None where a byte of it is given nothing (undefined)."""
    from replayfmt.edit.shadow import ByteState, Shadow

    sizes = {o.id: o.size for o in cap.objects() if isinstance(o, m.Buffer)}
    labels = {o.id: o.label for o in cap.objects() if isinstance(o, m.Buffer)}
    reads = {b for b, label in labels.items() if label != "z"}
    shadow = Shadow(sizes, lambda p, out, at: cap.read_payload_into(p, out, at), cap.object)
    for op in cap:
        if op.kind == _K.LAUNCH and cap.object(op.executable).functions[op.function].name == "gather":
            read = {r.target_buffer for r in op.relocations} & reads
            return {
                labels[b]: shadow.read(b, 0, sizes[b]).tobytes()
                if shadow.state_runs(b, 0, sizes[b], ByteState.KNOWN) == [(0, sizes[b])]
                else None
                for b in read
            }
        shadow.apply(op)
    return {}


def _gather_inputs_known(cap, original) -> bool:
    """Whether the capture's gather launch is given what it read in ``original`` (a capture)."""
    mine, theirs = _gather_inputs(cap), _gather_inputs(original)
    return bool(mine) and mine == theirs


def test_the_inputs_phase_keeps_what_the_captured_work_reads_though_the_test_needs_none(step, tmp_path):
    """A fault that shows whatever the data (a planted out-of-bounds read): the test alone would
    let every byte go, but a candidate is kept only when it also verifies as captured, so the
    result holds the gather launch and what it reads. The test is asked only of candidates that
    verify."""
    path, e = step
    asked: list[tuple[str, bool]] = []
    original = replayfmt.open(path)

    def runner(test, candidate, device, timeout):
        with replayfmt.open(candidate) as cap:
            has = _has(cap, "gather")
            if isinstance(test, AsCaptured):
                asked.append(("as-captured", has))
                known = _gather_inputs_known(cap, original)
                return Answer(not known, "verified" if known else "2 of 3 ranges wrong")
            asked.append(("test", has))
            return Answer(has, "CUDA_ERROR_ILLEGAL_ADDRESS" if has else "replayed without a fault")

    out = tmp_path / "small.kreplay"
    planted = tmp_path / "oob.cubin"
    planted.write_bytes(b"\x7fELF")
    test = Faults("CUDA_ERROR_ILLEGAL_ADDRESS", (f"9={planted}",))
    result = reduce(path, out, test, ReduceOptions(devices=(None,), least_piece=256), runner=runner)
    assert result.kept == (e.ops["gather"],) and not result.inputs_kept
    with replayfmt.open(out) as cap:
        assert _gather_inputs_known(cap, original)
    tables, index, x, y = 16, 4 * 256, 4 * 256, 4 * 256
    assert result.given_bytes == tables + index + x + y < result.given_bytes_first
    checks = [k for k, (what, _) in enumerate(asked) if what == "as-captured"]
    assert len(checks) > 3 and asked.count(("as-captured", False)) == 0  # the inputs phase's, of gather alone
    first = checks[0]
    assert all(what == "test" for what, _ in asked[:first])  # the operations phase: the test alone
    # then the test is asked of a candidate only after it verified
    answered = [(what, has) for what, has in asked[first:]]
    assert all(answered[k - 1][0] == "as-captured" for k, (what, _) in enumerate(answered) if what == "test")


def test_bytes_left_out_are_checked_poisoned_not_undefined(step, tmp_path):
    """On the GPU an axpy verified as captured without its x: the allocation still held x from the
    candidate replayed before it (undefined bytes may hold anything, the right ones too). Here an
    oracle that passes undefined inputs as that allocation did: the check as captured sees the
    bytes left out poisoned (each byte complemented), so they are wrong, and every input stays."""
    path, e = step
    original = replayfmt.open(path)
    expected = _gather_inputs(original)

    def runner(test, candidate, device, timeout):
        with replayfmt.open(candidate) as cap:
            has = _has(cap, "gather")
            if isinstance(test, AsCaptured):
                given = _gather_inputs(cap)
                wrong = [k for k, v in given.items() if v is not None and v != expected[k]]
                return Answer(bool(wrong), f"{wrong} wrong" if wrong else "verified")
            return Answer(has, "CUDA_ERROR_ILLEGAL_ADDRESS" if has else "no fault")

    planted = tmp_path / "oob.cubin"
    planted.write_bytes(b"\x7fELF")
    test = Faults("CUDA_ERROR_ILLEGAL_ADDRESS", (f"{e.ids['exe']}={planted}",))
    out = tmp_path / "small.kreplay"
    result = reduce(path, out, test, ReduceOptions(devices=(None,), least_piece=256), runner=runner)
    assert result.kept == (e.ops["gather"],)
    with replayfmt.open(out) as cap:
        assert _gather_inputs(cap) == expected
    assert result.given_bytes == 16 + 3 * 4 * 256


@pytest.mark.parametrize("test", [Faults("CUDA_ERROR_ILLEGAL_ADDRESS"), FailsVerify()])
def test_without_a_substitution_the_inputs_are_kept_whole(step, tmp_path, test):
    """The captured work itself faults (or computes wrong): nothing says which bytes it reads, so
    none is dropped, and the report says why."""
    path, e = step
    asked = []

    def runner(t, candidate, device, timeout):
        asked.append(t.kind)
        with replayfmt.open(candidate) as cap:
            return Answer(_has(cap, "gather"), "fails")

    result = reduce(path, tmp_path / "o.kreplay", test, ReduceOptions(devices=(None,)), runner=runner)
    assert result.kept == (e.ops["gather"],) and result.given_bytes == result.given_bytes_first > 0
    if isinstance(test, Faults):
        assert asked.count("as-captured") == 1 and asked[-1] == "as-captured"
        assert result.inputs_kept.startswith("replayed as captured it does not verify")
    else:
        assert "as-captured" not in asked and "cannot tell a wrong kernel" in result.inputs_kept
    assert f"inputs       all kept: {result.inputs_kept}" in str(result)


def test_an_interrupt_leaves_the_best_capture_so_far(step, tmp_path):
    path, _e = step
    calls = []

    def runner(test, candidate, device, timeout):
        calls.append(candidate)
        if len(calls) == 4:
            raise KeyboardInterrupt
        with replayfmt.open(candidate) as cap:
            return Answer(sum(op.kind == _K.LAUNCH for op in cap) >= 1 and _has(cap, "gather"))

    out = tmp_path / "small.kreplay"
    result = reduce(path, out, Command("true {}"), ReduceOptions(devices=(None,)), runner=runner)
    assert result.stopped.startswith("interrupted") and result.written
    with replayfmt.open(out) as cap:
        assert _has(cap, "gather")  # what is there still fails the test
        assert dict(cap.metadata.properties)["reduce.operations_kept"]
    assert result.work_after < result.work_before


def _has(cap, kernel: str) -> bool:
    return any(cap.object(op.executable).functions[op.function].name == kernel for op in cap if op.kind == _K.LAUNCH)


def test_the_try_budget_stops_with_a_failing_result(step, tmp_path):
    path, _ = step
    out = tmp_path / "small.kreplay"
    result = reduce(path, out, Command(GREP_GATHER), ReduceOptions(devices=(None,), max_tries=3))
    assert result.replays == 3 and "--max-tries 3" in result.stopped
    if result.written:
        assert "gather" in "".join(f.name for f in _functions(out))


def _functions(path):
    with replayfmt.open(path) as cap:
        return [f for o in cap.objects() if isinstance(o, m.Executable) for f in o.functions]


def test_refuses_an_original_that_passes(step, tmp_path):
    path, _ = step
    with pytest.raises(OriginalPasses, match="the original capture passes the test"):
        reduce(path, tmp_path / "o.kreplay", Command("exit 0; {}"), ReduceOptions(devices=(None,)))
    assert not (tmp_path / "o.kreplay").exists()


def test_substitutions_are_renumbered_for_each_candidate(tmp_path):
    sub = tmp_path / "k.cubin"
    sub.write_bytes(b"\x7fELF")
    test = FailsVerify((f"9={sub}", f"4@cubin={sub}"))
    assert test.for_candidate({9: 2}).substitutions == (f"2={sub}",)  # executable 4 is not kept
    assert decode_test(encode_test(test)) == test
    assert decode_test(encode_test(Faults("CUDA_ERROR_ILLEGAL_ADDRESS"))).error == "CUDA_ERROR_ILLEGAL_ADDRESS"


# -- the command line -------------------------------------------------------------------------------


def test_cli_reduces_and_prints_its_report(step, tmp_path):
    path, _ = step
    out = tmp_path / "small.kreplay"
    res = CliRunner().invoke(
        reduce_main, [str(path), "-o", str(out), "--command", GREP_GATHER, "--quiet", "--no-state-phase"]
    )
    assert res.exit_code == 0, res.output
    assert "launches 4 -> 1" in res.output and out.exists()


def test_cli_never_overwrites_without_overwrite(step, tmp_path):
    path, _ = step
    out = tmp_path / "small.kreplay"
    out.write_bytes(b"mine")
    res = CliRunner().invoke(reduce_main, [str(path), "-o", str(out), "--command", GREP_GATHER])
    assert res.exit_code == 2 and "--overwrite" in res.output and out.read_bytes() == b"mine"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give exactly one test"),
        (["--fails-verify", "--command", "x {}"], "got --fails-verify, --command"),
        (["--command", "no placeholder"], "put {} where"),
        (["--slower", "1.2"], "give --executable-substitution"),
    ],
)
def test_cli_refuses_bad_tests(step, tmp_path, args, message):
    path, _ = step
    res = CliRunner().invoke(reduce_main, [str(path), "-o", str(tmp_path / "o.kreplay"), *args])
    assert res.exit_code == 2 and message in res.output, res.output


def test_help_has_examples():
    res = CliRunner().invoke(reduce_main, ["--help"])
    assert res.exit_code == 0 and "Examples:" in res.output and "--fails-verify" in res.output


def test_json_answers_round_trip():
    assert decode_test(encode_test(AsCaptured())) == AsCaptured()
    a = Answer(True, "x", "CUDA_ERROR_ILLEGAL_ADDRESS", 1.5)
    assert Answer(**json.loads(json.dumps(a.to_json()))) == a
    assert np.isfinite(a.seconds)


def test_a_replay_test_without_a_gpu_is_an_environment_error(step, tmp_path):
    """The worker (a real child process) answers that it has no device: exit 2, not 'passes'."""

    if environment_ok() is None:
        pytest.skip("a GPU is here: the worker replays instead")
    path, _ = step
    res = CliRunner().invoke(reduce_main, [str(path), "-o", str(tmp_path / "o.kreplay"), "--faults", "--quiet"])
    assert res.exit_code == 2 and "the test needs a GPU to replay on" in res.output, res.output


def test_candidates_fan_out_one_at_a_time_per_device(step, tmp_path):
    path, e = step
    seen: list[int | None] = []

    def runner(test, candidate, device, timeout):
        seen.append(device)
        with replayfmt.open(candidate) as cap:
            return Answer(_has(cap, "gather"))

    one = reduce(path, tmp_path / "one.kreplay", Command("x {}"), ReduceOptions(devices=(None,)), runner=runner)
    seen.clear()
    two = reduce(path, tmp_path / "two.kreplay", Command("x {}"), ReduceOptions(devices=(0, 1)), runner=runner)
    assert two.kept == one.kept == (e.ops["gather"],)
    assert set(seen) == {0, 1} and two.devices == 2


def test_a_budget_spent_before_any_candidate_failed_writes_nothing(step, tmp_path):
    path, _ = step
    out = tmp_path / "o.kreplay"
    res = CliRunner().invoke(
        reduce_main, [str(path), "-o", str(out), "--command", GREP_GATHER, "--max-tries", "1", "--quiet"]
    )
    assert res.exit_code == 1 and "nothing written" in res.output and "--max-tries 1" in res.output
    assert not out.exists()


def test_the_lazy_shadow_answers_as_the_shadow_does(step):
    from replayfmt.edit.lazy_shadow import LazyShadow
    from replayfmt.edit.shadow import ByteState, Shadow

    path, _ = step
    with replayfmt.open(path) as cap:
        sizes = {o.id: o.size for o in cap.objects() if isinstance(o, m.Buffer)}
        read = lambda p, out, at: cap.read_payload_into(p, out, at)  # noqa: E731
        plain, lazy = Shadow(sizes, read, cap.object), LazyShadow(sizes, read, cap.object)
        compared = 0
        for op in cap:
            plain.apply(op)
            lazy.apply(op)
            for b, size in sizes.items():
                known = plain.state_runs(b, 0, size, ByteState.KNOWN)
                assert known == lazy.state_runs(b, 0, size, ByteState.KNOWN)
                for lo, hi in known:
                    assert plain.read(b, lo, hi - lo).tobytes() == lazy.read(b, lo, hi - lo).tobytes()
                    compared += 1
        assert compared > 50


def test_the_inputs_phase_keeps_exactly_the_bytes_the_failure_needs(step, tmp_path):
    """An oracle that fails only when the gather launch is there and sees the original's indices:
    the result keeps that launch and those 1024 bytes, none of the rest it was given."""
    from replayfmt.edit.shadow import ByteState, Shadow

    path, e = step

    def runner(test, candidate, device, timeout):
        with replayfmt.open(candidate) as cap:
            sizes = {o.id: o.size for o in cap.objects() if isinstance(o, m.Buffer)}
            idx = next((o.id for o in cap.objects() if o.label == "idx"), None)
            if idx is None:
                return Answer(False)
            if isinstance(test, AsCaptured):
                return Answer(False, "verified")  # the indices are all this oracle's gather reads
            shadow = Shadow(sizes, lambda p, out, at: cap.read_payload_into(p, out, at), cap.object)
            for op in cap:
                if op.kind == _K.LAUNCH and cap.object(op.executable).functions[op.function].name == "gather":
                    known = shadow.state_runs(idx, 0, sizes[idx], ByteState.KNOWN) == [(0, sizes[idx])]
                    return Answer(known and shadow.read(idx, 0, sizes[idx]).tobytes() == e.data["IDX"].tobytes())
                shadow.apply(op)
        return Answer(False)

    out = tmp_path / "small.kreplay"
    result = reduce(path, out, Command("x {}"), ReduceOptions(devices=(None,), least_piece=256), runner=runner)
    assert result.kept == (e.ops["gather"],)
    assert result.given_bytes == 1024 and result.given_bytes_first > 4 * 1024


# -- where the search starts: hints from the test and the original's answer ------------------------


def _device_work(path):
    with replayfmt.open(path) as cap:
        return [
            (op.kind, cap.object(op.executable).functions[op.function].name if op.kind == _K.LAUNCH else "")
            for op in cap
            if op.kind in m.DEVICE_WORK
        ]


def _recording(predicate, detail=""):
    """A runner answering ``predicate(capture)`` for the test (and 'verifies' as captured), which
    records each candidate's device work."""
    seen = []

    def runner(test, candidate, device, timeout):
        seen.append(_device_work(candidate))
        if isinstance(test, AsCaptured):
            return Answer(False, "verified")
        with replayfmt.open(candidate) as cap:
            failing = predicate(cap)
        return Answer(failing, detail if failing else "passes")

    return runner, seen


def test_a_substitution_starts_the_search_at_the_substituted_executables_launches(step, tmp_path):
    """The bug is in the substitute, so its launches alone are the first candidate: the copies and
    memsets (6 of the 10 operations) go in one replay instead of ddmin's halving."""
    path, e = step
    planted = tmp_path / "oob.cubin"
    planted.write_bytes(b"\x7fELF")
    runner, seen = _recording(lambda cap: _has(cap, "gather"))
    test = Faults("CUDA_ERROR_ILLEGAL_ADDRESS", (f"{e.ids['exe']}={planted}",))
    result = reduce(
        path, tmp_path / "o.kreplay", test, ReduceOptions(devices=(None,), state_phase=False), runner=runner
    )
    # (a candidate's inputs are given as uploads: its device work other than launches)
    assert len(seen[0]) == 10 and [name for kind, name in seen[1] if kind == _K.LAUNCH] == [
        "saxpy",
        "gather",
        "saxpy",
        "saxpy",
    ]
    assert result.kept == (e.ops["gather"],)
    without = reduce(
        path,
        tmp_path / "p.kreplay",
        Faults("CUDA_ERROR_ILLEGAL_ADDRESS"),
        ReduceOptions(devices=(None,), state_phase=False),
        runner=_recording(lambda cap: _has(cap, "gather"))[0],
    )
    assert without.kept == result.kept and result.replays < without.replays


def test_a_fault_starts_the_search_at_the_launches_its_message_names(step, tmp_path):
    path, e = step
    detail = "CUDA_ERROR_ILLEGAL_ADDRESS; launches since the last successful synchronisation: "
    detail += f"operation {e.ops['gather']} (gather)"
    runner, seen = _recording(lambda cap: _has(cap, "gather"), detail)
    result = reduce(path, tmp_path / "o.kreplay", Faults(), ReduceOptions(devices=(None,)), runner=runner)
    assert seen[1] == [(_K.LAUNCH, "gather")] and result.kept == (e.ops["gather"],)
    # no candidate after the original held any launch but the one named: no halving was needed
    assert all([name for kind, name in work if kind == _K.LAUNCH] == ["gather"] for work in seen[1:])


def test_a_wrong_range_starts_the_search_at_its_last_writer(step, tmp_path):
    path, e = step
    with replayfmt.open(path) as cap:
        act = next(op.index for op in cap if op.kind == _K.CHECKPOINT and op.index > e.ops["gather"])
    detail = (
        f"1 of 5 compared range(s) failed; first: op    {act} buffer {e.ids['z']} bytes 0+1024 (float32[256]): FAIL"
    )
    runner, seen = _recording(lambda cap: _has(cap, "gather"), detail)
    result = reduce(path, tmp_path / "o.kreplay", FailsVerify(), ReduceOptions(devices=(None,)), runner=runner)
    assert seen[1] == [(_K.LAUNCH, "gather")] and result.kept == (e.ops["gather"],) and result.replays == 2


def test_a_hint_that_passes_leaves_the_whole_search_to_ddmin(step, tmp_path):
    """A hint is a candidate like any other: one that passes the test costs a replay, and the
    search goes on from the whole capture, so the result still fails the test."""
    path, e = step
    detail = f"launches since the last successful synchronisation: operation {e.ops['saxpy0']} (saxpy)"
    runner, seen = _recording(lambda cap: _has(cap, "gather"), detail)
    result = reduce(path, tmp_path / "o.kreplay", Faults(), ReduceOptions(devices=(None,)), runner=runner)
    assert seen[1] == [(_K.LAUNCH, "saxpy")] and result.kept == (e.ops["gather"],)


def test_a_hint_the_capture_cannot_feed_is_tried_with_its_producers(tmp_path, cubin):
    """A region capture without inner checkpoints: gather alone cannot be built (what it reads
    only removed work wrote), so the hint is tried with the work that produced its inputs."""
    path = tmp_path / "bare.kreplay"
    e = step_capture(path, cubin, checkpoints=False)
    with replayfmt.open(path) as cap:
        r = Reducible(cap, path)
        closed = r.with_producers([e.ops["gather"]])
        assert {e.ops["saxpy0"], e.ops["copy"], e.ops["gather"]} <= set(closed)
        assert e.ops["saxpy1"] not in closed and e.ops["saxpy2"] not in closed
        r.build(closed, tmp_path / "c.kreplay")
        assert r.launches_of({e.ids["spare"]}) == [] and e.ops["gather"] in r.launches_of({e.ids["exe"]})
        assert r.last_writer(e.ops["saxpy1"], e.ids["z"]) == e.ops["gather"]
    detail = f"launches since the last successful synchronisation: operation {e.ops['gather']} (gather)"
    runner, seen = _recording(lambda cap: _has(cap, "gather"), detail)
    result = reduce(path, tmp_path / "o.kreplay", Faults(), ReduceOptions(devices=(None,)), runner=runner)
    assert result.not_buildable >= 1 and len(seen[1]) == len(closed) < len(seen[0])
    assert e.ops["gather"] in result.kept


def test_a_reduction_that_wrote_nothing_says_so_and_gives_no_sizes_of_a_result():
    from pathlib import Path

    from replayfmt.edit.reduce import ReduceResult

    said = ReduceResult(
        Path("step.kreplay"),
        Path("small.kreplay"),
        "--fails-verify",
        operations_before=1661,
        last_answer="3 of 1658 compared range(s) failed",
        stopped="--max-seconds 60 reached: the result fails the test but may not be minimal",
    ).lines()
    assert said[0] == "reduced      step.kreplay: nothing written"
    assert not any(line.startswith(("operations", "bytes", "verdict")) for line in said)
    assert "original     3 of 1658 compared range(s) failed" in said
    assert "stopped      --max-seconds 60 reached before any smaller candidate failed" in said
