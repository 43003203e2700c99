"""What a replay plan is asked for: executable substitutions, launch-shape overrides, file
remaps and strictness (``PlanOptions``), each parsed from its flag with a one-line error."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from replayfmt.container.files import FileRemap
from replayfmt.errors import ReplayUsageError
from replayfmt.format import model as m
from replayfmt.format.model import EXECUTABLE_FORMATS

MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)
MAX_THREADS_PER_BLOCK = 1024
MAX_SHARED_MEMORY = 227 << 10  # shared memory of one block, static and dynamic: the most any GPU gives (sm_90+)


@dataclass(frozen=True)
class Substitution:
    """``--executable-substitution``: replace executable ``target`` (None: all) by a file."""

    target: int | None
    path: Path
    format: m.ExecutableFormat | None = None

    @classmethod
    def parse(cls, spec: str) -> Substitution:
        """``ID=PATH``, ``ID@FORMAT=PATH`` (cubin|ptx|fatbin) or ``all=PATH``."""
        key, sep, path = spec.partition("=")
        if not sep or not path or not key:
            raise ReplayUsageError(f"--executable-substitution {spec!r}: expected ID=PATH, ID@FORMAT=PATH or all=PATH")
        key, _, fmt = key.partition("@")
        fmt_value = None
        if fmt:
            if fmt not in EXECUTABLE_FORMATS:
                raise ReplayUsageError(f"--executable-substitution {spec!r}: format must be cubin, ptx or fatbin")
            fmt_value = EXECUTABLE_FORMATS[fmt]
        if key == "all":
            return cls(None, Path(path), fmt_value)
        if not key.isdigit() or int(key) == 0:
            raise ReplayUsageError(
                f"--executable-substitution {spec!r}: {key!r} is not an executable id "
                "(ids as dump-replay --kind=executable prints them, or 'all')"
            )
        return cls(int(key), Path(path), fmt_value)


def check_substitutions(subs: list[Substitution]) -> None:
    if any(s.target is None for s in subs) and len(subs) > 1:
        raise ReplayUsageError("--executable-substitution all=PATH cannot be combined with other substitutions")
    seen: set[int] = set()
    for s in subs:
        if s.target is not None:
            if s.target in seen:
                raise ReplayUsageError(f"--executable-substitution: executable {s.target} is substituted twice")
            seen.add(s.target)


_DIMS = re.compile(r"^(\d+)(?:,(\d+))?(?:,(\d+))?$")


class Shaped(Protocol):
    """What runs somewhere: a launch, or a CUDA graph's kernel node."""

    @property
    def grid(self) -> m.Dims: ...
    @property
    def block(self) -> m.Dims: ...
    @property
    def shared_memory(self) -> int: ...


@dataclass(frozen=True)
class ShapeOverride:
    """A change to where a launch runs; ``None`` keeps the captured setting. The one way a launch
    is reshaped: ``run-replay --launch`` gives one operation its own (:class:`LaunchOverride`),
    tune-replay gives every launch and graph kernel node it tunes a candidate's (sent to its
    workers as :meth:`to_dict`)."""

    grid: m.Dims | None = None
    block: m.Dims | None = None
    shared_memory: int | None = None

    def apply(self, captured: Shaped) -> LaunchShape:
        """``captured``'s shape with this override applied."""
        return LaunchShape(
            self.grid or captured.grid,
            self.block or captured.block,
            captured.shared_memory if self.shared_memory is None else self.shared_memory,
        )

    def to_dict(self) -> dict[str, Any]:
        return {"grid": self.grid, "block": self.block, "shared_memory": self.shared_memory}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShapeOverride:
        """The inverse of :meth:`to_dict`; anything but three positive dims or a byte count is a
        ReplayUsageError naming the field."""

        def dims(key: str) -> m.Dims | None:
            value = data.get(key)
            if value is None:
                return None
            if not (isinstance(value, list | tuple) and len(value) == 3 and all(_positive(v) for v in value)):
                raise ReplayUsageError(f"launch shape: {key} {value!r} is not three dimensions >= 1")
            return (int(value[0]), int(value[1]), int(value[2]))

        smem = data.get("shared_memory")
        if smem is not None and not (isinstance(smem, int) and not isinstance(smem, bool) and smem >= 0):
            raise ReplayUsageError(f"launch shape: shared_memory {smem!r} is not a byte count")
        return cls(dims("grid"), dims("block"), smem)


def _positive(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclass(frozen=True)
class LaunchOverride:
    """``--launch=OP:grid=X,Y,Z,block=X,Y,Z,smem=N``: change one launch's shape;
    ``--launch=OP:skip``: do not run it (to see that verification notices a missing kernel)."""

    operation: int
    grid: m.Dims | None = None
    block: m.Dims | None = None
    shared_memory: int | None = None
    skip: bool = False

    @classmethod
    def parse(cls, spec: str) -> LaunchOverride:
        op, sep, rest = spec.partition(":")
        if not sep or not op.isdigit() or not rest:
            raise ReplayUsageError(f"--launch {spec!r}: expected OP:grid=X,Y,Z,block=X,Y,Z,smem=N or OP:skip")
        if rest == "skip":
            return cls(int(op), skip=True)
        values: dict[str, object] = {}
        for part in re.split(r",(?=[a-z])", rest):
            key, eq, value = part.partition("=")
            if not eq or key not in ("grid", "block", "smem"):
                raise ReplayUsageError(
                    f"--launch {spec!r}: unknown setting {part!r} (grid, block or smem; or skip alone)"
                )
            if key == "smem":
                if not value.isdigit():
                    raise ReplayUsageError(f"--launch {spec!r}: smem must be a byte count")
                values["shared_memory"] = int(value)
            else:
                match = _DIMS.match(value)
                if not match:
                    raise ReplayUsageError(f"--launch {spec!r}: {key} must be X or X,Y or X,Y,Z")
                dims = tuple(int(v) if v else 1 for v in match.groups())
                if min(dims) < 1:
                    raise ReplayUsageError(f"--launch {spec!r}: {key} dimensions must be >= 1")
                values[key] = dims
        return cls(int(op), **values)  # type: ignore[arg-type]

    @property
    def reshape(self) -> ShapeOverride:
        """The shape change alone (what tune-replay gives each launch it tunes)."""
        return ShapeOverride(self.grid, self.block, self.shared_memory)

    def shape(self, op: m.Launch) -> LaunchShape:
        """The launch's shape with this override applied (settings it does not give stay captured)."""
        return self.reshape.apply(op)


@dataclass(frozen=True)
class LaunchShape:
    """Where a launch runs: grid, block and bytes of dynamic shared memory."""

    grid: m.Dims
    block: m.Dims
    shared_memory: int

    @property
    def threads_per_block(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


def launch_shape(op: m.Launch, override: LaunchOverride | None) -> LaunchShape:
    """The shape a launch is replayed with: the captured one, or ``override`` applied to it."""
    if override is None:
        return LaunchShape(op.grid, op.block, op.shared_memory)
    return override.shape(op)


def captured_file_range(reference: m.FileReference, offset: int, size: int) -> m.FileRange | None:
    """The captured range of a file that holds all of ``[offset, offset + size)`` (None: none does)."""
    for r in reference.ranges:
        if r.offset <= offset and offset + size <= r.offset + r.size:
            return r
    return None


@dataclass(frozen=True)
class PlanOptions:
    substitutions: tuple[Substitution, ...] = ()
    remaps: tuple[FileRemap, ...] = ()
    launch_overrides: tuple[LaunchOverride, ...] = ()
    fixed_addresses: bool = False
    continue_on_error: bool = False
    jit_from_ptx: bool = False  # load every executable from its PTX (the driver JIT-compiles it), never a cubin
    # read every payload the plan uses and check its frames' hashes (the GPU-less verdicts: the
    # dry run, dump-replay's replayable); a replay checks them as it stages the bytes instead
    verify_payloads: bool = False

    def to_dict(self) -> dict[str, Any]:
        """One JSON-able object (what a worker process is told)."""
        return {
            "substitutions": [
                {"target": s.target, "path": str(s.path), "format": None if s.format is None else int(s.format)}
                for s in self.substitutions
            ],
            "remaps": [[r.captured_prefix, r.new_prefix] for r in self.remaps],
            "launch_overrides": [
                {"operation": o.operation, "skip": o.skip, **o.reshape.to_dict()} for o in self.launch_overrides
            ],
            "fixed_addresses": self.fixed_addresses,
            "continue_on_error": self.continue_on_error,
            "jit_from_ptx": self.jit_from_ptx,
            "verify_payloads": self.verify_payloads,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PlanOptions:
        """The inverse of :meth:`to_dict` (absent keys: the defaults); a malformed object is a
        ReplayUsageError naming what."""
        try:
            substitutions = tuple(
                Substitution(
                    s["target"], Path(s["path"]), None if s["format"] is None else m.ExecutableFormat(s["format"])
                )
                for s in data.get("substitutions", ())
            )
            remaps = tuple(FileRemap(str(a), str(b)) for a, b in data.get("remaps", ()))
            overrides = []
            for o in data.get("launch_overrides", ()):
                shape = ShapeOverride.from_dict(o)
                overrides.append(
                    LaunchOverride(int(o["operation"]), shape.grid, shape.block, shape.shared_memory, bool(o["skip"]))
                )
        except (KeyError, TypeError, ValueError) as exc:
            raise ReplayUsageError(f"plan options: malformed ({exc!r})") from None
        return cls(
            substitutions,
            remaps,
            tuple(overrides),
            bool(data.get("fixed_addresses", False)),
            bool(data.get("continue_on_error", False)),
            bool(data.get("jit_from_ptx", False)),
            bool(data.get("verify_payloads", False)),
        )
