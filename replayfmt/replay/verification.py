"""Verification over several replays, with evidence: the verdict of ``run-replay --verify``.

:class:`Verification` watches the replays a Replayer runs (it is their ``observer``), then:

1. every piece of every compared range (a checkpoint entry or expected download, cut into typed
   and untyped pieces) that a replay reproduced bit for bit is **exact**; when none differs, that
   is all (a deterministic program pays for one replay);
2. a piece that differed is replayed again until ``replays`` replays in all, and judged per
   element against their spread (:mod:`replayfmt.replay.judge`): within run-to-run variation, or
   wrong;
3. a piece whose checkpoint expects what its starting state already holds proves nothing by
   matching: it is replayed *poisoned* (:mod:`replayfmt.replay.evidence`) and reported as proven,
   unchanged by the region, or could not be proven; with a reference replay of the unmodified
   capture (when kernels were substituted, reshaped or skipped), bytes the captured kernels write
   but this replay left as they started are a failure.

The verdict (:class:`VerificationReport`) is earned: verified means no piece is wrong and at least
one piece was compared with evidence. The rule is docs/VERIFY.md.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from replayfmt.errors import ReplayUsageError
from replayfmt.format import model as m
from replayfmt.replay.compare import FLOATING, Tolerance, tolerances
from replayfmt.replay.evidence import Classified, Evidence, Piece, Poison, classify, patched, pieces, poison
from replayfmt.replay.judge import (
    WORD,
    PieceJudgement,
    RangeObservation,
    ValueVerdict,
    judged_dtype,
    lanes_of,
    part_size,
)
from replayfmt.replay.options import RunResult
from replayfmt.replay.plan import Plan
from replayfmt.replay.state import PoisonWrite
from replayfmt.replay.verification_report import RangeReport, VerificationReport
from replayfmt.replay.verify_types import DEFAULT_REPLAYS, EvidencePolicy

SINGLE_ROUNDS = 4  # pieces still tainted after two poisoned rounds that are poisoned one by one
Key = tuple[int, int, int]  # (operation, buffer, offset) of a piece


class VerifyingReplayer(Protocol):
    """What verification needs of a Replayer."""

    plan: Plan
    observer: Any

    def run(self, repetitions: int = 1, *, verify: bool | None = None) -> RunResult: ...

    def poison(self, writes: dict[int, list[PoisonWrite]] | None) -> None: ...

    def verify_only(self, ranges: set[tuple[int, int, int]] | None) -> None: ...


class _Collector:
    """The Replayer's observer: folds each replay's bytes of each piece."""

    def __init__(self, owner: Verification) -> None:
        self.owner = owner

    def observe(
        self,
        operation: int,
        buffer: m.Buffer,
        offset: int,
        expected: bytes,
        actual: bytes,
        types: tuple[m.TypedTensor, ...],
        same: bool | None = None,
    ) -> None:
        self.owner.observe(operation, buffer, offset, expected, actual, types, same)


class Verification:
    """Collects the replays of one Replayer and judges them (see the module's docstring).

    ``replays``: replays in all when a piece differs (1: judge the first replay alone);
    ``evidence``: when to replay poisoned what matched by starting as expected."""

    def __init__(
        self,
        plan: Plan,
        *,
        replays: int = DEFAULT_REPLAYS,
        evidence: EvidencePolicy = EvidencePolicy.AUTO,
        tolerance: Tolerance = Tolerance(),
    ) -> None:
        if replays < 1:
            raise ReplayUsageError(f"verification needs at least one replay, not {replays}")
        self.plan = plan
        self.tolerance = tolerance
        self.replays_wanted = replays
        self.policy = evidence
        self.poisoning = False  # whether pieces that start as expected were replayed poisoned
        self.entry_of: dict[Key, Key] = {}  # piece -> the (operation, buffer, offset) of its compared range
        self.collector = _Collector(self)
        self.pieces: dict[Key, Piece] = {}
        self.observed: dict[Key, RangeObservation] = {}  # pieces that differed in some replay
        self.seen: dict[Key, int] = {}  # replays that compared each piece
        # checkpoint entries in ranges that held none of the program's data when their region began
        # (1.6 STATE_FLAG_UNDEFINED state) -> region start: poisoned whatever their type
        self.undefined: dict[Key, int] = {}
        self.candidates = self._candidates()  # (operation, buffer, entry offset) -> region start
        self.expected: dict[Key, bytes] = {}  # the expected bytes of pieces of candidate entries
        self.replays = 0
        self.poisoned_replays = 0
        self.evidence: dict[Key, Evidence] = {}
        self.notes: dict[Key, str] = {}
        self.round_written: dict[Key, np.ndarray] = {}  # bytes written in the first poisoned replay
        self.regions: dict[Key, int] = {}  # pieces of candidate entries -> where their region begins
        self.reference = False  # a replay of the unmodified capture said which bytes its kernels write
        self.nothing_else = False  # every compared piece started as expected
        self._poisoned: dict[Key, bytes] | None = None  # the poisoned replay's bytes, while one runs
        self._poisoned_keys: set[Key] = set()
        self._track_only: set[Key] | None = None
        self._cut: dict[Key, list[Piece]] = {}  # compared range -> its pieces, as last cut
        self.pointer_types: dict[int, list[tuple[int, m.DType]]] | None = None  # from launches, when needed
        self.entry_types: dict[Key, tuple[m.TypedTensor, ...]] = {}  # compared ranges typed by launches
        self.retyped: dict[Key, int] = {}  # such ranges -> replays that matched them before they were typed
        self.left: dict[Key, np.ndarray] = {}  # pieces left as they started: the bytes left, per byte

    # -- collecting ---------------------------------------------------------------------------

    def observe(
        self,
        operation: int,
        buffer: m.Buffer,
        offset: int,
        expected: bytes,
        actual: bytes,
        types: tuple[m.TypedTensor, ...],
        same: bool | None = None,
    ) -> None:
        """One replay's bytes of one compared range; ``same``: whether they are the expected bytes,
        when the caller knows already (None: compared here)."""
        entry = (operation, buffer.id, offset)
        region = self.candidates.get(entry)
        if same is None:
            same = expected == actual  # the common case: nothing to slice, nothing to fold
        cut = self._cut.get(entry)
        if self._poisoned is not None:  # a poisoned replay: the pieces as the replays cut them
            for piece in cut or ():
                if piece.key in self._poisoned_keys:
                    self._poisoned[piece.key] = actual[piece.start : piece.start + piece.size]
            return
        types = self._entry_types(entry, buffer, expected, actual, types) if not same else types
        if cut is None or not same:
            cut = self._cut[entry] = pieces(operation, buffer, offset, len(expected), types)
        for piece in cut:
            key = piece.key
            whole = piece.start == 0 and piece.size == len(expected)
            end = piece.start + piece.size
            if self._track_only is not None and key not in self._track_only:
                continue
            self.pieces.setdefault(key, piece)
            self.entry_of.setdefault(key, (operation, buffer.id, offset))
            seen = self.seen.get(key, self.retyped.get((operation, buffer.id, offset), 0))
            self.seen[key] = seen + 1
            if same and key not in self.observed and (region is None or key in self.expected):
                continue  # reproduced: nothing to slice, nothing to fold
            want = expected if whole else expected[piece.start : end]
            got = want if same else actual if whole else actual[piece.start : end]
            if region is not None and key not in self.expected:
                self.expected[key] = want
                self.regions[key] = region
            observation = self.observed.get(key)
            if observation is None and not same and got != want:
                observation = self.observed[key] = RangeObservation(
                    want, piece.dtype if piece.typed else m.DType.UNKNOWN, piece.shape, piece.offset
                )
                for _ in range(seen):  # the earlier replays reproduced it
                    observation.add(want)
            if observation is not None:
                observation.add(got)

    def _entry_types(
        self, entry: Key, buffer: m.Buffer, expected: bytes, actual: bytes, types: tuple[m.TypedTensor, ...]
    ) -> tuple[m.TypedTensor, ...]:
        """The types a compared range is cut by: the capture's (checkpoint, then buffer); where a
        range that differs has untyped bytes (no types at all, or dead tensors between the live
        ones of a segment), the element types of the kernel parameters that point into them
        (Triton's signatures name them), found once, when first needed."""
        known = self.entry_types.get(entry)
        if known is not None:
            return known
        if buffer.dtype != m.DType.UNKNOWN or buffer.ranges or expected == actual:
            return types
        if self.pointer_types is None:
            self.pointer_types = pointer_types(self.plan)
        points = self.pointer_types.get(buffer.id, [])
        found = entry_pointer_types(points, buffer.id, entry[2], len(expected), around=types)
        if not found:
            return types
        found = tuple(sorted((*types, *found), key=lambda t: t.offset))
        self.entry_types[entry] = found
        for key in [k for k, e in self.entry_of.items() if e == entry and k in self.pieces]:
            if not self.pieces[key].typed and key not in self.observed:  # re-cut: the earlier replays matched
                self.retyped[entry] = self.seen.pop(key, 0)
                del self.pieces[key]
        return found

    def _candidates(self) -> dict[tuple[int, int, int], int]:
        """Checkpoint entries whose expected bytes are their region's starting state (same
        payload, or the same bytes): matching them proves nothing by itself. The state that covers
        an entry is the last one of its region that does (1.6: an undefined range's state, set after
        the others, takes precedence); entries it marks undefined are noted (``self.undefined``)."""
        out: dict[tuple[int, int, int], int] = {}
        if not self.plan.state:
            return out
        capture = self.plan.capture
        for index, region in self.plan.checkpoint_regions.items():
            copies = self.plan.state.get(region, [])
            if not copies:
                continue
            op = capture.operation(index)
            assert isinstance(op, m.Checkpoint)
            inside: dict[int, list[m.CheckpointEntry]] = {}  # state copy -> entries of part of it
            for e in op.entries:
                for k in range(len(copies) - 1, -1, -1):  # the last state that covers it
                    c = copies[k]
                    if c.dst_buffer != e.buffer or not (
                        c.dst_offset <= e.offset and e.offset + e.size <= c.dst_offset + c.size
                    ):
                        continue
                    if c.index in self.plan.undefined_state:
                        self.undefined[(index, e.buffer, e.offset)] = region
                    if (c.dst_offset, c.size) != (e.offset, e.size):
                        inside.setdefault(k, []).append(e)
                    elif c.payload == e.payload or capture.payload(c.payload).hash == capture.payload(e.payload).hash:
                        out[(index, e.buffer, e.offset)] = region
                    break
            # a kernel-mode region restores whole allocations and checkpoints the ranges its launch
            # changed: the state is read once per copy (its frames decompressed once), not per entry
            for k, entries in inside.items():
                c = copies[k]
                lo = min(e.offset for e in entries) - c.dst_offset
                start = capture.read_payload(c.payload, lo, max(e.offset + e.size for e in entries) - c.dst_offset - lo)
                for e in entries:
                    at = e.offset - c.dst_offset - lo
                    if start[at : at + e.size] == capture.read_payload(e.payload, 0, e.size):
                        out[(index, e.buffer, e.offset)] = region
        return out

    # -- running ------------------------------------------------------------------------------

    def attach(self, replayer: VerifyingReplayer) -> None:
        """Watch the replays ``replayer`` runs from now on (with verification on)."""
        replayer.observer = self.collector

    def note_runs(self, result: RunResult) -> None:
        """The replayer ran ``len(result.device_ms)`` replays while attached."""
        self.replays += len(result.device_ms)

    def finish(self, replayer: VerifyingReplayer) -> list[str]:
        """Replay what differed until ``replays`` replays in all, then poison what proves nothing
        (see the module's docstring); returns the errors of those runs."""
        errors: list[str] = []
        if self.observed and self.replays < self.replays_wanted:
            self._track_only = set(self.observed)
            replayer.verify_only({self.entry_of[k] for k in self.observed})
            try:
                more = replayer.run(self.replays_wanted - self.replays, verify=True)
            finally:
                replayer.verify_only(None)
                self._track_only = None
            self.replays += len(more.device_ms)
            errors += more.errors
        # nothing else is evidence: every piece started as expected (a capture after a warm-up)
        self.nothing_else = bool(self.pieces) and all(key in self.expected for key in self.pieces)
        if self.kernels_changed and self.policy is not EvidencePolicy.NEVER:
            self._piece_candidates()
            self._undefined_candidates()
        if self.expected and self._wants_poison():
            self.poisoning = True
            errors += self._poison_rounds(replayer)
        return errors

    def _piece_candidates(self) -> None:
        """When kernels were changed: also the float pieces of other checkpoint entries that start
        as expected (an output in a caching-allocator segment whose other tensors changed), so
        that a kernel left out is seen there too. Reads their starting state: done only then."""
        capture = self.plan.capture
        inside: dict[tuple[int, int], list[tuple[Key, Piece, m.CheckpointEntry]]] = {}  # (region, copy) -> pieces
        for key, piece in self.pieces.items():
            if key in self.expected or key in self.observed or not (piece.typed and piece.dtype in FLOATING):
                continue
            operation, buffer, offset = self.entry_of[key]
            region = self.plan.checkpoint_regions.get(operation)
            op = capture.operation(operation) if region is not None else None
            if not isinstance(op, m.Checkpoint):
                continue  # an expected download: no region state to compare with
            entry = next(e for e in op.entries if (e.buffer, e.offset) == (buffer, offset))
            copies = self.plan.state.get(region, [])
            for k in range(len(copies) - 1, -1, -1):  # the last state that covers it
                c = copies[k]
                if (
                    c.dst_buffer == buffer
                    and c.dst_offset <= piece.offset <= piece.offset + piece.size <= c.dst_offset + c.size
                ):
                    inside.setdefault((region, k), []).append((key, piece, entry))
                    break
        # each state copy read once for all its pieces (its frames decompressed once), each entry once
        for (region, k), found in inside.items():
            c = self.plan.state[region][k]
            lo = min(piece.offset for _, piece, _ in found)
            hi = max(piece.offset + piece.size for _, piece, _ in found)
            start = capture.read_payload(c.payload, lo - c.dst_offset, hi - lo)
            entries: dict[tuple[int, int], bytes] = {}
            for key, piece, entry in found:
                if (entry.buffer, entry.offset) not in entries:
                    entries[entry.buffer, entry.offset] = capture.read_payload(entry.payload, 0, entry.size)
                at = piece.offset - entry.offset
                expected = entries[entry.buffer, entry.offset][at : at + piece.size]
                if start[piece.offset - lo : piece.offset - lo + piece.size] == expected:
                    self.expected[key], self.regions[key] = expected, region

    def _undefined_candidates(self) -> None:
        """When kernels were changed: also the pieces of ranges that held none of the program's
        data when their region began (an allocation the region made, memory its framework called
        free), whatever their starting state: the bytes there that the captured kernels write are
        the region's work, and a kernel left out must be seen even where what it wrote was already
        there by chance (a step run before it left the same values in reused memory)."""
        capture = self.plan.capture
        for key in self.pieces:
            entry = self.entry_of[key]
            region = self.undefined.get(entry)
            if region is None or key in self.expected or key in self.observed:
                continue
            op = capture.operation(entry[0])
            assert isinstance(op, m.Checkpoint)
            e = next(e for e in op.entries if (e.buffer, e.offset) == entry[1:])
            piece = self.pieces[key]
            self.expected[key] = capture.read_payload(e.payload, piece.offset - e.offset, piece.size)
            self.regions[key] = region

    def _undefined_key(self, key: Key) -> bool:
        return self.entry_of.get(key) in self.undefined

    @property
    def kernels_changed(self) -> bool:
        """Whether the replay runs other work than the capture's (substitutions, launch overrides)."""
        options = self.plan.options
        return bool(options.substitutions or options.launch_overrides)

    def _wants_poison(self) -> bool:
        if self.policy is EvidencePolicy.AUTO:
            # a range undefined when its region began was given the bytes the region left there: it
            # starts as expected by construction, and only a poisoned replay shows the region writing it
            undefined = any(self._undefined_key(key) for key in self.expected)
            return self.kernels_changed or self.nothing_else or undefined
        return self.policy is EvidencePolicy.ALWAYS

    def _poison_run(self, replayer: VerifyingReplayer, keys: list[Key]) -> dict[Key, bytes]:
        writes: dict[int, list[PoisonWrite]] = {}
        for key in keys:
            piece = self.pieces[key]
            writes.setdefault(self.regions[key], []).append(
                PoisonWrite(piece.buffer, piece.offset, poison(self.expected[key], self._how(key)))
            )
        self._poisoned, self._poisoned_keys = {}, set(keys)
        replayer.poison(writes)
        replayer.verify_only({self.entry_of[k] for k in keys})
        try:
            result = replayer.run(1, verify=True)
        finally:
            replayer.poison(None)
            replayer.verify_only(None)
            got, self._poisoned = self._poisoned, None
        self.poisoned_replays += 1
        return got if not result.errors else {}

    def _poison_rounds(self, replayer: VerifyingReplayer) -> list[str]:
        """Round 1 poisons every candidate piece (:meth:`_how`); round 2 those written wrongly (from
        a poisoned input, say); then up to SINGLE_ROUNDS one by one; what stays tainted reads
        itself. Integer and untyped pieces are not poisoned where the capture stores device
        addresses in memory (a poisoned address would fault)."""
        keys = []
        gentle = self.policy is EvidencePolicy.ALWAYS or self.nothing_else
        # pointers stored in memory (1.3 data relocations): a kernel that follows a poisoned
        # pointer faults (CUDA_ERROR_MISALIGNED_ADDRESS, or worse) and ends the replay; such a
        # capture's integers and untyped bytes may hold more pointers, so none of them is poisoned
        stores_pointers = self.plan.needs_fixed_addresses or self.plan.stores_pointers
        for key in sorted(self.expected):
            # a range that held none of the program's data when its region began is no lock, counter
            # or pointer table the region reads before writing: poisoned whatever its type
            if not self._how(key).gentle or self._undefined_key(key):
                keys.append(key)
            elif stores_pointers:
                self.notes[key] = "it started as expected; not poisoned: the capture stores device addresses in memory"
            elif not gentle:
                self.notes[key] = (
                    "it started as expected; integers and untyped bytes are poisoned only when nothing else is "
                    "evidence (they may be locks or counters a kernel waits on): --evidence=always"
                )
            else:
                keys.append(key)
        pending = keys
        unsure: set[Key] = set()  # left as poisoned in a round that poisoned others too
        for round_number in range(2 + SINGLE_ROUNDS):
            single = round_number >= 2
            if not pending or (single and len(pending) > 2 + SINGLE_ROUNDS - round_number):
                break  # done, or too many left to poison one by one
            batch = pending[:1] if single else pending
            got = self._poison_run(replayer, batch)
            if not got:
                return [f"a poisoned replay failed; {len(pending)} range(s) could not be proven"]
            tainted = []
            results = {key: self._classify(key, got[key]) for key in batch if key in got}
            # a region whose every poisoned piece came back as poisoned seems to write nothing; or
            # it wrote from a poisoned input that a permutation (a copy, a reverse) carried over
            # whole: poisoned alone, each piece tells
            silent = set() if single else self._silent_regions(results)
            for key in batch:
                if key not in got:  # not read back (its range was not compared in that replay)
                    self.notes[key] = "a poisoned replay did not read it back"
                    continue
                result = results[key]
                if round_number == 0:
                    self.round_written[key] = result.written
                if result.evidence is Evidence.TAINTED:
                    tainted.append(key)
                    unsure.discard(key)  # written wrongly: no longer a piece that merely looked untouched
                elif result.evidence is Evidence.UNCHANGED and self.regions[key] in silent:
                    tainted.append(key)
                    unsure.add(key)
                else:
                    self.evidence[key] = result.evidence
                    piece = self.pieces[key]
                    if result.evidence is Evidence.PROVEN and result.written_bytes < piece.size:
                        self.notes[key] = f"{result.written_bytes} of {piece.size} bytes written, the rest unchanged"
            if single:
                for key in tainted:  # poisoned alone and still written wrongly: it reads itself
                    self.evidence[key] = Evidence.UNPROVEN
                    self.notes[key] = "the region reads it before writing it"
                pending = pending[1:]
            else:
                pending = tainted
        for key in pending:
            if key in unsure:  # too many to poison one by one: as the rounds together left it
                self.evidence[key] = Evidence.UNCHANGED
                continue
            self.evidence[key] = Evidence.UNPROVEN
            self.notes[key] = "the region reads it before writing it (or reads another range that does)"
        return []

    def _silent_regions(self, results: dict[Key, Classified]) -> set[int]:
        """The regions of which more than one piece was poisoned and every one came back unchanged."""
        pieces: dict[int, list[Evidence]] = {}
        for key, result in results.items():
            pieces.setdefault(self.regions[key], []).append(result.evidence)
        return {r for r, seen in pieces.items() if len(seen) > 1 and all(e is Evidence.UNCHANGED for e in seen)}

    def _how(self, key: Key) -> Poison:
        """Floats are poisoned whole; integers and untyped bytes gently (indices stay in bounds)."""
        piece = self.pieces[key]
        if piece.typed and piece.dtype in FLOATING:
            return Poison(1, False)
        return Poison(part_size(piece.dtype) if piece.typed else WORD, True)

    def _classify(self, key: Key, actual: bytes) -> Classified:
        expected = self.expected[key]
        observation = self.observed.get(key)
        if observation is None:
            return classify(expected, actual, how=self._how(key))
        written = classify(expected, actual, how=self._how(key), judge_ok=True).written
        again = observation.copy()
        again.add(patched(expected, actual, written))
        ok = (
            again.judge(nondeterministic=True, tolerance=self._asked(self.pieces[key])).verdict
            is not ValueVerdict.WRONG
        )
        return classify(expected, actual, how=self._how(key), judge_ok=ok)

    @property
    def wants_reference(self) -> bool:
        """Whether kernels were changed (substituted, reshaped, skipped) and pieces were replayed
        poisoned: then a poisoned replay of the unmodified capture says which bytes its kernels
        write (:meth:`reference_written`, on another Replayer; :meth:`apply_reference`)."""
        return bool(self.round_written) and self.kernels_changed

    def reference_written(self, replayer: VerifyingReplayer) -> dict[Key, np.ndarray]:
        """Run the first poisoned round on a replayer of the *unmodified* capture (set up with
        verification on): which bytes of each poisoned piece the captured kernels write."""
        self.attach(replayer)
        keys = sorted(self.round_written)
        got = self._poison_run(replayer, keys) if keys else {}
        return {key: classify(self.expected[key], got[key], how=self._how(key)).written for key in keys if key in got}

    def apply_reference(self, written: dict[Key, np.ndarray]) -> None:
        """Bytes the captured kernels write that this replay left as they started: a failure,
        reported by the elements left (their poison against the captured value)."""
        self.reference = True
        for key, reference in written.items():
            mine = self.round_written.get(key)
            if mine is None:
                continue
            left = reference & ~mine
            missing = int(left.sum())
            if missing:
                self.evidence[key] = Evidence.LEFT
                self.notes[key] = f"{missing} byte(s) the captured kernels write were not written by this replay"
                self.left[key] = left

    # -- the verdict --------------------------------------------------------------------------

    def _asked(self, piece: Piece) -> tuple[float, float] | None:
        """(rtol, atol) that --tolerance allows a float piece, or None."""
        floating = self.tolerance.enabled and piece.typed and piece.dtype in FLOATING
        return tolerances(piece.dtype, self.tolerance) if floating else None

    def report(self) -> VerificationReport:
        observations = self.observed
        nondeterministic = any(o.varies for o in observations.values())
        ranges = []
        for key, piece in self.pieces.items():
            observation = observations.get(key)
            if observation is None:
                lanes = lanes_of(piece.dtype if piece.typed else m.DType.UNKNOWN, piece.size, piece.offset)
                name = piece.dtype.name.lower() if piece.typed else "bytes"
                judgement = PieceJudgement(ValueVerdict.EXACT, name, piece.typed, lanes, 0, 0)
            else:
                judgement = observation.judge(nondeterministic=nondeterministic, tolerance=self._asked(piece))
            default = Evidence.UNPROVEN if key in self.expected else Evidence.COMPARED
            if key in self.expected and not self.poisoning:
                self.notes.setdefault(key, "it started as expected; not replayed poisoned: --evidence=always")
            evidence = self.evidence.get(key, default)
            if key in self.left:
                judgement = self._left_judgement(key, piece)
            ranges.append(RangeReport(piece, judgement, evidence, self.notes.get(key, "")))
        return VerificationReport(ranges, self.replays, self.poisoned_replays, nondeterministic, self.reference)

    def _left_judgement(self, key: Key, piece: Piece) -> PieceJudgement:
        """A piece left as it started, judged as the replay left it: the elements the captured
        kernels write hold their poison, the others their captured value; so the report names the
        first elements left, as it names wrong ones."""
        expected = self.expected[key]
        left = np.frombuffer(poison(expected, self._how(key)), np.uint8)
        replayed = np.where(self.left[key], left, np.frombuffer(expected, np.uint8)).tobytes()
        dtype = piece.dtype if piece.typed else m.DType.UNKNOWN
        observation = RangeObservation(expected, dtype, piece.shape, piece.offset)
        observation.add(replayed)
        return observation.judge(nondeterministic=False)


def pointer_types(plan: Plan) -> dict[int, list[tuple[int, m.DType]]]:
    """Buffer id -> (offset, dtype) of every launch parameter that points into it and whose element
    type the capture knows (a Triton signature's ``*fp32``), sorted by offset."""
    out: dict[int, set[tuple[int, m.DType]]] = {}
    for op in plan.capture.iter_operations():
        if not isinstance(op, m.Launch) or op.executable not in plan.images:
            continue
        fn = plan.function(op.executable, op.function)
        typed = {p.offset: p.dtype for p in fn.parameters if p.kind == m.ParameterKind.POINTER and p.dtype}
        for r in op.relocations:
            dtype = typed.get(r.site_offset) if r.site_buffer == 0 else None
            if dtype is not None and judged_dtype(dtype):
                out.setdefault(r.target_buffer, set()).add((r.target_offset, dtype))
    return {buffer: sorted(found) for buffer, found in out.items()}


POINTED = "(a kernel parameter's type)"  # the name of a range typed by the pointers into it


def entry_pointer_types(
    found: list[tuple[int, m.DType]],
    buffer: int,
    offset: int,
    size: int,
    *,
    around: tuple[m.TypedTensor, ...] = (),
) -> tuple[m.TypedTensor, ...]:
    """The untyped bytes of [offset, offset + size) of a buffer (outside ``around``, the types it
    has) typed from the pointers into them: each from where a pointer points to where the next
    pointer or typed range begins (a place pointed at with two dtypes stays untyped)."""
    points: dict[int, set[m.DType]] = {}
    for at, dtype in found:
        inside = any(t.offset <= at < t.offset + t.size for t in around)
        if offset <= at < offset + size and not inside:
            points.setdefault(at, set()).add(dtype)
    bounds = sorted({*points, *(t.offset for t in around), offset + size})
    out = []
    for at in sorted(points):
        end = min(b for b in bounds if b > at)
        if len(points[at]) == 1:
            out.append(m.TypedTensor(buffer, at, end - at, next(iter(points[at])), name=POINTED))
    return tuple(out)
