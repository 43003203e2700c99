"""The judging rule of docs/VERIFY.md, element by element: ordered keys and ulps of every float
dtype (fp64 to fp8), NaN and infinities, spreads over replays, the dtype's ulp widening, integers,
untyped bytes, and how compared ranges are cut into typed pieces."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from replayfmt.format import model as m
from replayfmt.replay.evidence import Evidence, Poison, classify, patched, pieces, poison
from replayfmt.replay.judge import (
    NEIGHBOURHOOD,
    ULP_WIDENING,
    PieceJudgement,
    RangeObservation,
    ValueVerdict,
    key_values,
    lanes_of,
    ordered_keys,
    part_size,
)
from replayfmt.replay.verification import entry_pointer_types

D = m.DType


def bf16(values) -> bytes:
    """bfloat16 by truncating float32 (values chosen to be exact)."""
    return (np.asarray(values, np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()


def fp8_e4m3(codes) -> bytes:
    return np.asarray(codes, np.uint8).tobytes()


ENCODE = {
    D.FLOAT16: lambda v: np.asarray(v, "<f2").tobytes(),
    D.FLOAT32: lambda v: np.asarray(v, "<f4").tobytes(),
    D.FLOAT64: lambda v: np.asarray(v, "<f8").tobytes(),
    D.BFLOAT16: bf16,
}


@pytest.mark.parametrize("dtype", [D.FLOAT16, D.BFLOAT16, D.FLOAT32, D.FLOAT64])
def test_keys_order_like_values_and_count_ulps(dtype):
    values = [-np.inf, -2.0, -1.0, -0.0, 0.0, 1.0, 1.5, 2.0, np.inf]
    keys, nan = ordered_keys(ENCODE[dtype](values), dtype)
    assert not nan.any()
    assert np.all(np.diff(keys) >= 0) and keys[3] == keys[4] == 0  # -0 and +0 share a key
    assert key_values(keys, dtype).tolist() == [-np.inf, -2.0, -1.0, 0.0, 0.0, 1.0, 1.5, 2.0, np.inf]
    mantissa = {D.FLOAT16: 10, D.BFLOAT16: 7, D.FLOAT32: 23, D.FLOAT64: 52}[dtype]
    assert keys[7] - keys[5] == 1 << mantissa  # 1.0 to 2.0 is one binade: 2**mantissa ulps
    assert keys[5] + keys[2] == 0  # symmetric about zero


@pytest.mark.parametrize("dtype", [D.FLOAT16, D.BFLOAT16, D.FLOAT32, D.FLOAT64])
def test_neighbouring_floats_are_one_ulp_apart_across_zero(dtype):
    tiny = {D.FLOAT16: "<u2", D.BFLOAT16: "<u2", D.FLOAT32: "<u4", D.FLOAT64: "<u8"}[dtype]
    sign = 1 << (part_size(dtype) * 8 - 1)
    bits = np.array([sign | 1, 0, 1], tiny)  # -min subnormal, +0, +min subnormal
    keys, _ = ordered_keys(bits.tobytes(), dtype)
    assert keys.tolist() == [-1, 0, 1]


def test_nan_payloads_are_found_in_every_float_dtype():
    assert ordered_keys(np.array([np.nan, 1], "<f4").tobytes(), D.FLOAT32)[1].tolist() == [True, False]
    assert ordered_keys(np.array([0x7E00, 0xFC00], "<u2").tobytes(), D.FLOAT16)[1].tolist() == [True, False]
    assert ordered_keys(np.array([0x7FC1, 0xFF80], "<u2").tobytes(), D.BFLOAT16)[1].tolist() == [True, False]
    nan64 = np.array([0x7FF0000000000001, 0xFFF0000000000000], "<u8")
    assert ordered_keys(nan64.tobytes(), D.FLOAT64)[1].tolist() == [True, False]
    # e4m3fn has no infinities: only S.1111.111 is NaN; e5m2 is IEEE-like
    assert ordered_keys(fp8_e4m3([0x7F, 0xFF, 0x7E, 0x78]), D.FLOAT8_E4M3FN)[1].tolist() == [True, True, False, False]
    assert ordered_keys(fp8_e4m3([0x7C, 0x7D, 0xFF, 0x7B]), D.FLOAT8_E5M2)[1].tolist() == [False, True, True, False]


def test_fp8_values_and_keys():
    e4m3 = key_values(ordered_keys(fp8_e4m3([0x38, 0x7E, 0xB8, 0x01, 0x00]), D.FLOAT8_E4M3FN)[0], D.FLOAT8_E4M3FN)
    assert e4m3.tolist() == [1.0, 448.0, -1.0, 2.0**-9, 0.0]
    e5m2 = key_values(ordered_keys(fp8_e4m3([0x3C, 0x7B, 0x7C, 0xBC]), D.FLOAT8_E5M2)[0], D.FLOAT8_E5M2)
    assert e5m2.tolist() == [1.0, 57344.0, np.inf, -1.0]
    keys, _ = ordered_keys(fp8_e4m3([0x38, 0x39]), D.FLOAT8_E4M3FN)
    assert keys[1] - keys[0] == 1


@pytest.mark.parametrize(
    ("dtype", "values"),
    [
        (D.INT8, [-128, -1, 0, 127]),
        (D.UINT8, [0, 1, 255, 7]),
        (D.INT32, [-(2**31), -5, 0, 2**31 - 1]),
        (D.UINT32, [0, 2**32 - 1, 3, 9]),
        (D.INT64, [-(2**63), -1, 0, 2**63 - 1]),
        (D.UINT64, [0, 2**63, 2**64 - 1, 1]),
        (D.BOOL, [0, 1, 1, 0]),
    ],
)
def test_integer_keys_keep_order_and_values(dtype, values):
    code = {D.INT8: "i1", D.UINT8: "u1", D.INT32: "<i4", D.UINT32: "<u4", D.INT64: "<i8", D.UINT64: "<u8", D.BOOL: "u1"}
    data = np.array(values, code[dtype]).tobytes()
    keys, nan = ordered_keys(data, dtype)
    assert not nan.any()
    order = np.argsort(np.array(values, dtype=object).astype(float), kind="stable")
    assert np.all(np.diff(keys[order]) >= 0)
    assert key_values(keys, dtype).tolist() == [float(v) for v in values]


def observe(dtype, captured, replays) -> RangeObservation:
    encode = ENCODE.get(dtype, lambda v: np.asarray(v, "<i4").tobytes())
    o = RangeObservation(encode(captured), dtype)
    for r in replays:
        o.add(encode(r))
    return o


def test_identical_replays_are_exact():
    o = observe(D.FLOAT32, [1.0, 2.0], [[1.0, 2.0]] * 3)
    judgement = o.judge(nondeterministic=True)
    assert judgement.verdict is ValueVerdict.EXACT and judgement.elements == 2 and not o.varies


def test_inside_the_replays_spread_is_run_to_run_variation():
    o = observe(D.FLOAT32, [1.0, 5.0], [[1.0, 4.9], [1.0, 5.1]])
    j = o.judge(nondeterministic=True)
    assert o.varies and j.verdict is ValueVerdict.VARIES and j.wrong == 0 and j.differing == 1
    assert j.spread_abs == pytest.approx(0.2, rel=1e-5) and j.largest_abs_diff == pytest.approx(0.1, rel=1e-4)
    assert j.shown[0].position == (1,) and j.shown[0].replay_min == pytest.approx(4.9) and not j.shown[0].wrong


def test_a_value_outside_the_spread_by_more_than_it_is_wrong():
    o = observe(D.FLOAT32, [1.0, 5.75], [[1.0, 4.75], [1.0, 5.25]])  # 0.5 past the max; spread 0.5: tolerated
    assert o.judge(nondeterministic=True).verdict is ValueVerdict.VARIES
    o = observe(D.FLOAT32, [1.0, 5.875], [[1.0, 4.75], [1.0, 5.25]])
    j = o.judge(nondeterministic=True)
    assert j.verdict is ValueVerdict.WRONG and j.wrong == 1 and j.shown[0].wrong and j.shown[0].index == 1


def test_a_float_may_lie_a_few_spreads_out_where_the_captured_run_varied_otherwise():
    # the H100 case: an index_add_ sum captured 0.0047 from 3 replays that spread 0.0006
    replays = [[476.1393, 100.0], [476.1399, 100.0], [476.1396, 100.0]]
    assert observe(D.FLOAT32, [476.144, 100.0], replays).judge(nondeterministic=True).verdict is ValueVerdict.VARIES
    # past 16 spreads it is wrong; so is an integer that far, and a float past 2**16 ulps of itself
    assert observe(D.FLOAT32, [476.151, 100.0], replays).judge(nondeterministic=True).verdict is ValueVerdict.WRONG
    ints = [[1000, 7], [1001, 7], [1000, 7]]
    assert observe(D.INT32, [1003, 7], ints).judge(nondeterministic=True).verdict is ValueVerdict.WRONG
    wide = [[1000.0, 1.0], [1000.5, 1.0]]  # 16 spreads of 0.5 would forgive 1.0 at 1.0; the cap does not
    assert observe(D.FLOAT32, [1000.0, 2.0], wide).judge(nondeterministic=True).verdict is ValueVerdict.WRONG
    assert observe(D.FLOAT32, [1001.5, 1.0], wide).judge(nondeterministic=True).verdict is ValueVerdict.VARIES


@pytest.mark.parametrize("dtype", [D.FLOAT16, D.BFLOAT16, D.FLOAT32, D.FLOAT64])
def test_the_ulp_widening_follows_the_dtype_and_needs_nondeterminism(dtype):
    one = ordered_keys(ENCODE[dtype]([1.0]), dtype)[0][0]
    widening = ULP_WIDENING[dtype]

    def with_ulps(k: int) -> float:
        return float(key_values(np.array([one + k]), dtype)[0])

    # every replay agrees (by chance) on 1.0; the captured value is a few ulps off
    for ulps, nondeterministic, verdict in [
        (widening, True, ValueVerdict.VARIES),
        (widening + 1, True, ValueVerdict.WRONG),
        (1, False, ValueVerdict.WRONG),  # a program that never varied is judged exactly
    ]:
        o = observe(dtype, [with_ulps(ulps)], [[1.0], [1.0], [1.0]])
        j = o.judge(nondeterministic=nondeterministic)
        assert j.verdict is verdict, (ulps, nondeterministic)
        assert j.largest_ulp_diff == ulps and j.widening_ulps == (widening if nondeterministic else 0)


def test_fp8_widening_is_one_ulp():
    o = RangeObservation(fp8_e4m3([0x39]), D.FLOAT8_E4M3FN)
    for _ in range(3):
        o.add(fp8_e4m3([0x38]))
    assert o.judge(nondeterministic=True).verdict is ValueVerdict.VARIES
    o = RangeObservation(fp8_e4m3([0x3A]), D.FLOAT8_E4M3FN)
    o.add(fp8_e4m3([0x38]))
    assert o.judge(nondeterministic=True).verdict is ValueVerdict.WRONG


def test_nan_needs_a_nan_and_a_number_needs_a_number():
    assert observe(D.FLOAT32, [np.nan], [[1.0], [np.nan]]).judge(nondeterministic=True).verdict is ValueVerdict.VARIES
    j = observe(D.FLOAT32, [np.nan], [[1.0], [1.0]]).judge(nondeterministic=True)
    assert j.verdict is ValueVerdict.WRONG and np.isnan(j.shown[0].captured) and j.shown[0].abs_diff == np.inf
    j = observe(D.FLOAT32, [1.0], [[np.nan], [np.nan]]).judge(nondeterministic=True)
    assert j.verdict is ValueVerdict.WRONG and np.isnan(j.shown[0].replay_min)
    # a NaN with another payload is still a NaN
    other = np.array([0x7FC00001], "<u4").tobytes()
    o = RangeObservation(np.array([np.nan], "<f4").tobytes(), D.FLOAT32)
    o.add(other)
    assert o.judge(nondeterministic=False).verdict is ValueVerdict.VARIES


def test_infinities_compare_as_the_largest_values():
    assert observe(D.FLOAT32, [np.inf], [[np.inf]] * 2).judge(nondeterministic=True).verdict is ValueVerdict.EXACT
    j = observe(D.FLOAT32, [np.inf], [[3e38], [3.1e38]]).judge(nondeterministic=True)
    assert j.verdict is ValueVerdict.WRONG and j.shown[0].abs_diff == np.inf
    assert observe(D.FLOAT32, [3.05e38], [[3e38], [np.inf]]).judge(nondeterministic=True).verdict is ValueVerdict.VARIES


def test_signed_zeros_are_one_value():
    j = observe(D.FLOAT32, [-0.0], [[0.0], [0.0]]).judge(nondeterministic=False)
    assert j.verdict is ValueVerdict.VARIES and j.wrong == 0 and j.largest_ulp_diff == 0


def test_integers_allow_only_the_spread():
    assert observe(D.INT32, [5], [[4], [6]]).judge(nondeterministic=True).verdict is ValueVerdict.VARIES
    assert observe(D.INT32, [9], [[4], [6]]).judge(nondeterministic=True).verdict is ValueVerdict.WRONG
    j = observe(D.INT32, [7], [[5], [5]]).judge(nondeterministic=True)
    assert j.verdict is ValueVerdict.WRONG and j.widening_ulps == 0 and j.shown[0].ulp_diff == 2


def test_a_tolerance_asked_for_also_allows_values():
    o = observe(D.FLOAT32, [1.001], [[1.0], [1.0]])
    assert o.judge(nondeterministic=False).verdict is ValueVerdict.WRONG
    assert o.judge(nondeterministic=False, tolerance=(1e-2, 0.0)).verdict is ValueVerdict.VARIES


def test_untyped_bytes_may_differ_only_in_words_that_varied():
    expected = bytes(range(16))
    first, second = bytearray(expected), bytearray(expected)
    first[5] ^= 1  # word 1 varies between replays
    second[4] ^= 2
    o = RangeObservation(expected, D.UNKNOWN)
    o.add(bytes(first))
    o.add(bytes(second))
    j = o.judge(nondeterministic=True)
    assert j.verdict is ValueVerdict.VARIES and j.dtype == "bytes" and not j.typed and j.elements == 4  # words
    third = bytearray(expected)
    third[15] ^= 4  # word 3 never varied between replays... yet differs (its top byte) in every one
    o = RangeObservation(expected, D.UNKNOWN)
    for _ in range(2):
        o.add(bytes(third))
    j = o.judge(nondeterministic=True)
    assert j.verdict is ValueVerdict.WRONG and j.wrong == 1 and j.shown[0].index == 3 and j.shown[0].position == (12,)


def test_untyped_words_that_read_as_floats_get_the_float32_widening_in_a_nondeterministic_program():
    """A float sum's low bits agree by chance in every replay and differ in the captured run: in
    untyped memory (a dead tensor between live ones) the word reads as a normal float32 number and
    gets float32's few ulps, where the program varied somewhere; integers never do."""
    captured = np.array([1.5, -0.25, 3.0e-3, 7.0], np.float32)
    replay = captured.copy()
    replay.view(np.uint32)[0] += 2  # 2 ulps, the same in both replays
    replay.view(np.uint32)[1] -= 3
    o = RangeObservation(captured.tobytes(), D.UNKNOWN)
    for _ in range(2):
        o.add(replay.tobytes())
    varies = o.judge(nondeterministic=True)
    assert varies.verdict is ValueVerdict.VARIES and varies.differing == 2 and varies.widening_ulps == 4
    assert varies.shown[0].captured == 1.5 and varies.shown[0].ulp_diff == 2
    assert o.judge(nondeterministic=False).verdict is ValueVerdict.WRONG  # a deterministic program: bit for bit
    planted = replay.copy()
    planted[2] *= 1.01  # a wrong constant: thousands of ulps
    o = RangeObservation(captured.tobytes(), D.UNKNOWN)
    o.add(planted.tobytes())
    wrong = o.judge(nondeterministic=True)
    assert wrong.verdict is ValueVerdict.WRONG and wrong.wrong == 1 and wrong.shown[0].position == (8,)
    indices = np.array([0, 90, 4095, 1 << 20], np.int32)
    shifted = indices + np.array([0, 1, 0, 2], np.int32)  # an index off by one reads as a subnormal float
    o = RangeObservation(indices.tobytes(), D.UNKNOWN)
    o.add(shifted.tobytes())
    off = o.judge(nondeterministic=True)
    assert off.verdict is ValueVerdict.WRONG and off.wrong == 2
    assert [(e.captured, e.replay_min, e.ulp_diff) for e in off.shown] == [(90, 91, 1), (1 << 20, (1 << 20) + 2, 2)]


def test_untyped_words_cost_a_few_bytes_each_and_copy_independently():
    expected = np.random.default_rng(3).standard_normal(1 << 16).astype(np.float32).tobytes() + b"xy"
    o = RangeObservation(expected, D.UNKNOWN)
    o.add(expected)
    assert o.lanes == (1 << 16) + 1 and o.judge(nondeterministic=True).verdict is ValueVerdict.EXACT
    other = o.copy()
    changed = bytearray(expected)
    changed[-1] ^= 1  # the 2-byte tail is a word of its own
    other.add(bytes(changed))  # after one exact replay: the tail word varied between replays
    assert other.varies and other.judge(nondeterministic=True).verdict is ValueVerdict.VARIES
    assert not o.varies and o.judge(nondeterministic=True).verdict is ValueVerdict.EXACT and o.replays == 1
    fresh = RangeObservation(expected, D.UNKNOWN)
    fresh.add(bytes(changed))
    assert fresh.judge(nondeterministic=True).wrong == 1  # the same word, never seen right: wrong


def test_many_elements_show_the_first_few_with_the_count():
    captured = np.arange(1000, dtype=np.float32)
    replay = captured + 100
    o = RangeObservation(captured.tobytes(), D.FLOAT32, (10, 100))
    o.add(replay.tobytes())
    j = o.judge(nondeterministic=True)
    assert j.wrong == 1000 and len(j.shown) == 5
    assert [e.position for e in j.shown] == [(0, 0), (0, 1), (0, 2), (0, 3), (0, 4)]
    assert j.shown[0].abs_diff == 100 and j.largest_abs_diff == 100


def test_an_observation_needs_replays_of_its_size():
    o = RangeObservation(bytes(8), D.FLOAT32)
    with pytest.raises(ValueError, match="at least one replay"):
        o.judge(nondeterministic=True)
    with pytest.raises(ValueError, match="a replay gave 4 bytes for a piece of 8"):
        o.add(bytes(4))


# -- pieces and poison ---------------------------------------------------------------------------


def test_pieces_follow_the_checkpoint_types_and_leave_gaps_untyped():
    buffer = m.Buffer(size=1024, label="seg")
    types = (
        m.TypedTensor(2, 128, 256, D.BFLOAT16, (128,), (1,), "w"),
        m.TypedTensor(2, 512, 10, D.FLOAT32),  # 2 floats and a 2-byte tail
    )
    cut = pieces(9, buffer, 64, 960 - 64, types)
    assert [(p.offset, p.size, p.dtype, p.typed_by) for p in cut] == [
        (64, 64, D.UNKNOWN, ""),
        (128, 256, D.BFLOAT16, "checkpoint"),
        (384, 128, D.UNKNOWN, ""),
        (512, 8, D.FLOAT32, "checkpoint"),
        (520, 960 - 520, D.UNKNOWN, ""),
    ]
    assert cut[1].shape == (128,) and cut[1].name == "w" and cut[1].start == 64


def test_pieces_follow_the_buffer_when_the_checkpoint_says_nothing():
    whole = pieces(1, m.Buffer(size=64, dtype=D.FLOAT16, shape=(32,)), 0, 64, ())
    assert [(p.dtype, p.shape, p.typed_by) for p in whole] == [(D.FLOAT16, (32,), "buffer")]
    ranged = m.Buffer(size=64, ranges=(m.TypedRange(0, 32, D.INT32),))
    assert [(p.dtype, p.size) for p in pieces(1, ranged, 0, 64, ())] == [(D.INT32, 32), (D.UNKNOWN, 32)]
    assert [p.typed for p in pieces(1, m.Buffer(size=64), 0, 64, ())] == [False]


def test_pointer_types_type_an_untyped_range_up_to_the_next_pointer():
    found = [(0, D.FLOAT32), (256, D.BFLOAT16), (256, D.FLOAT16), (512, D.INT32), (4096, D.FLOAT32)]
    typed = entry_pointer_types(found, 7, 0, 1024)
    assert [(t.offset, t.size, t.dtype) for t in typed] == [(0, 256, D.FLOAT32), (512, 512, D.INT32)]
    # a segment whose live tensors are typed: pointers fill only the gaps, up to the next typed range
    live = (m.TypedTensor(7, 0, 128, D.BFLOAT16), m.TypedTensor(7, 768, 256, D.FLOAT16))
    typed = entry_pointer_types([(0, D.FLOAT32), (512, D.INT32)], 7, 0, 1024, around=live)
    assert [(t.offset, t.size, t.dtype) for t in typed] == [(512, 256, D.INT32)]
    cut = pieces(1, m.Buffer(size=1024), 0, 1024, tuple(sorted((*live, *typed), key=lambda t: t.offset)))
    assert [(p.offset, p.typed_by) for p in cut] == [
        (0, "checkpoint"),
        (128, ""),
        (512, "kernel parameter"),
        (768, "checkpoint"),
    ]


def test_poison_differs_from_every_expected_byte():
    expected = np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    assert all(a != b for a, b in zip(poison(expected), expected, strict=True))


def test_gentle_poison_moves_each_element_by_its_lowest_bit():
    indices = np.array([0, 1, 2, 1023, -5], np.int32)
    poisoned = np.frombuffer(poison(indices.tobytes(), Poison(4, True)), np.int32)
    assert poisoned.tolist() == [1, 0, 3, 1022, -6] and np.all(np.abs(poisoned - indices) == 1)
    words = bytes(range(10))  # untyped: 4-byte words, and a 2-byte tail
    gentle = np.frombuffer(poison(words, Poison(4, True)), np.uint8)
    assert np.flatnonzero(gentle != np.frombuffer(words, np.uint8)).tolist() == [0, 4, 8]
    left = classify(indices.tobytes(), poisoned.tobytes(), how=Poison(4, True))
    assert left.evidence is Evidence.UNCHANGED
    one_written = poisoned.copy()
    one_written[2] = 2
    done = classify(indices.tobytes(), one_written.tobytes(), how=Poison(4, True))
    assert done.evidence is Evidence.PROVEN and done.written_bytes == 4 and done.written[8:12].all()


def test_a_poisoned_piece_is_proven_unchanged_or_tainted():
    expected = np.arange(8, dtype=np.float32).tobytes()
    start = poison(expected)
    assert classify(expected, start).evidence is Evidence.UNCHANGED
    written = classify(expected, expected)
    assert written.evidence is Evidence.PROVEN and written.written_bytes == 32
    half = start[:16] + expected[16:]
    partial = classify(expected, half)
    assert partial.evidence is Evidence.PROVEN and partial.written_bytes == 16
    assert patched(expected, half, partial.written) == expected
    wrong = start[:16] + np.full(4, 7, np.float32).tobytes()
    assert classify(expected, wrong).evidence is Evidence.TAINTED
    assert classify(expected, wrong, judge_ok=True).evidence is Evidence.PROVEN


def test_untyped_float_words_may_differ_by_the_spread_of_varied_words_near_them():
    """A cancelling sum near zero varies by many ulps and little value: a word the replays agreed
    on may differ from the capture by what the words near it (the same tensor, laid out
    contiguously) varied by, not by what a far tensor did."""
    rng = np.random.default_rng(5)
    captured = (rng.standard_normal(6 * NEIGHBOURHOOD) * 1e-6).astype(np.float32)
    first, second = captured.copy(), captured.copy()
    first[:64] += np.float32(3e-12)  # block 0 varies by a few 1e-12 between replays
    second[:64] -= np.float32(3e-12)
    for replay in (first, second):
        replay[100] = captured[100] + np.float32(5e-12)  # agreed, yet ~40 ulps from the capture
        replay[5 * NEIGHBOURHOOD] = captured[5 * NEIGHBOURHOOD] + np.float32(5e-12)  # far from any variation
    o = RangeObservation(captured.tobytes(), D.UNKNOWN)
    o.add(first.tobytes())
    o.add(second.tobytes())
    j = o.judge(nondeterministic=True)
    assert j.verdict is ValueVerdict.WRONG and j.wrong == 1 and j.shown[0].index == 5 * NEIGHBOURHOOD
    assert j.shown[0].ulp_diff > ULP_WIDENING[D.FLOAT32]


def test_a_small_sum_amid_larger_terms_keeps_the_error_of_its_terms():
    """The H100's torch_geometric case: a float32 word of a scatter-add output, 7.28e-7 in the
    capture and 7.21e-7 in all 4 replays (1%, 131,072 ulps), amid words of 4e-5 that varied by
    2.4e-7. Past the 2**16-ulp cap, and still a number of its tensor's scale, off by far less
    than its neighbours vary: within variation. The same 1% on a word of the tensor's own scale,
    or on an integer read as a tiny float, stays wrong."""
    rng = np.random.default_rng(11)
    captured = (rng.standard_normal(4 * NEIGHBOURHOOD) * 4e-5).astype(np.float32)
    captured[500] = np.float32(7.282943e-07)
    replays = []
    for k in range(4):
        replay = captured.copy()
        replay[:256] += np.float32(6e-8 * (k - 1.5))  # the terms near it vary by up to 2.4e-7
        replay[500] = np.float32(7.208437e-07)  # agreed by every replay
        replays.append(replay)
    o = RangeObservation(captured.tobytes(), D.UNKNOWN)
    for replay in replays:
        o.add(replay.tobytes())
    j = o.judge(nondeterministic=True)
    assert j.verdict is ValueVerdict.VARIES and j.wrong == 0
    calm = captured.copy()  # no neighbour varied: nothing forgives it
    calm[500] = replays[0][500]
    o = RangeObservation(captured.tobytes(), D.UNKNOWN)
    o.add(calm.tobytes())
    o.add(calm.tobytes())
    assert o.judge(nondeterministic=True).verdict is ValueVerdict.WRONG

    big = captured.copy()
    big[600] = np.float32(1.2e-4)  # a value of the tensor's own scale, 1% off in every replay
    words = big.view(np.uint32).copy()
    words[700] = 300_000_000  # an integer, a tiny float, moved by millions
    o = RangeObservation(words.tobytes(), D.UNKNOWN)
    for replay in replays:
        moved = replay.copy()
        moved[600] = np.float32(1.2e-4 * 1.01)
        changed = moved.view(np.uint32).copy()
        changed[700] = 302_000_000
        o.add(changed.tobytes())
    j = o.judge(nondeterministic=True)
    assert j.verdict is ValueVerdict.WRONG and [e.index for e in j.shown] == [600, 700]


def test_a_steady_tensor_beside_a_noisy_one_keeps_its_own_cap():
    """Found in review: a block of values near 1 varying by 6e-6 beside a steady block near 2e-6;
    words of the steady block 40% and 150% off, alike in every replay, are wrong (the scale's
    allowance stops at 2**19 ulps of a word's own value)."""
    rng = np.random.default_rng(3)
    noisy = (1.0 + rng.standard_normal(NEIGHBOURHOOD) * 0.1).astype(np.float32)
    steady = (2e-6 * (1.0 + rng.random(NEIGHBOURHOOD))).astype(np.float32)
    captured = np.concatenate([noisy, steady])
    o = RangeObservation(captured.tobytes(), D.UNKNOWN)
    for k in range(3):
        replay = captured.copy()
        replay[:NEIGHBOURHOOD] += np.float32(3e-6 * (k - 1))
        replay[NEIGHBOURHOOD + 10] = captured[NEIGHBOURHOOD + 10] * np.float32(1.4)
        replay[NEIGHBOURHOOD + 20] = captured[NEIGHBOURHOOD + 20] * np.float32(2.5)
        o.add(replay.tobytes())
    j = o.judge(nondeterministic=True)
    assert j.verdict is ValueVerdict.WRONG and [e.index for e in j.shown] == [NEIGHBOURHOOD + 10, NEIGHBOURHOOD + 20]


def test_the_float_reading_of_untyped_words_forgives_no_scale_it_did_not_measure():
    """Found in review: an absolute neighbour spread forgave large integers (tiny as floats) moved
    by millions, and one varying non-float word (a counter, scratch) excused every float near it.
    The spread is measured in ulps, over varied words that stay floats of one sign and binade; a
    padded tail is never a float; infinities raise no warning."""
    rng = np.random.default_rng(7)
    captured = (rng.standard_normal(64) * 1e-6).astype(np.float32)
    words = captured.view(np.uint32).copy()
    words[10], words[11], words[12] = 10_000_000, 300_000_000, int(np.float32(1.0).view(np.uint32))
    first, second = words.copy(), words.copy()
    first[:8] += 3  # floats near by vary by a few ulps
    second[:8] -= 3
    first[20], second[20] = 0x1234_5678, 0xFEDC_BA98  # a word that is no float, varying wildly
    for replay in (first, second):
        replay[10], replay[11] = 20_000_000, 100_000_000
        replay[12] = np.float32(2.0).view(np.uint32)
    o = RangeObservation(words.tobytes(), D.UNKNOWN)
    o.add(first.tobytes())
    o.add(second.tobytes())
    j = o.judge(nondeterministic=True)
    assert j.verdict is ValueVerdict.WRONG and [e.index for e in j.shown] == [10, 11, 12]
    tail = RangeObservation(bytes([1, 0, 0x80]), D.UNKNOWN)
    tail.add(bytes([2, 0, 0x80]))
    assert tail.judge(nondeterministic=True).wrong == 1  # (0x00800001 padded would read as a normal float)
    masks = np.array([-np.inf, 0.5, np.inf, np.inf], np.float32)
    changed = masks.copy()
    changed[1] = 0.25
    o = RangeObservation(masks.tobytes(), D.UNKNOWN)
    o.add(masks.tobytes())
    o.add(changed.tobytes())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert o.judge(nondeterministic=True).verdict is ValueVerdict.VARIES


def test_untyped_words_are_the_buffers_words_whatever_byte_the_piece_starts_at():
    """Found in review: a piece that starts 2 bytes into a word (after a 2-byte value) cut the
    buffer's floats in halves, and a float's 1-ulp change read as a change of 65,536 ulps."""
    floats = np.array([1.5, -0.25, 3.0, 7.0], np.float32)  # word-aligned in their buffer
    changed = floats.copy()
    changed.view(np.uint32)[2] += 1  # one ulp, alike in every replay, unlike the capture
    piece, replay = floats.tobytes()[2:], changed.tobytes()[2:]  # the piece starts at buffer byte 2

    def judged(phase: int) -> PieceJudgement:
        o = RangeObservation(piece, D.UNKNOWN, phase=phase)
        o.add(replay)
        o.add(replay)
        return o.judge(nondeterministic=True)

    aligned = judged(2)
    assert aligned.verdict is ValueVerdict.VARIES and aligned.elements == lanes_of(D.UNKNOWN, 14, 2) == 4
    assert aligned.shown[0].position == (6,) and aligned.shown[0].ulp_diff == 1  # buffer byte 8, piece byte 6
    assert judged(0).verdict is ValueVerdict.WRONG  # cut at the piece's start, the float is two halves
