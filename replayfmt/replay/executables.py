"""The executables of a plan: which image each captured executable is loaded from (its payload,
its file, or an --executable-substitution), checked without a GPU (format, architecture, the
functions the capture launches and their parameter layouts)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from replayfmt.container.files import ResolvedFile, read_reference
from replayfmt.errors import AbiMismatchError, FileMismatchError, ReplayError, ReplayFormatError, ReplayUsageError
from replayfmt.format import model as m
from replayfmt.format.cubin import CubinError, CubinInfo, detect_format, parse_cubin
from replayfmt.format.model import EXECUTABLE_FORMATS
from replayfmt.format.targets import CodeTargets, code_targets, ptx_image
from replayfmt.reader import Capture
from replayfmt.replay.plan_options import PlanOptions


@dataclass
class ExecutableImage:
    """The code that will be loaded for one captured executable."""

    executable: m.Executable
    data: bytes
    format: m.ExecutableFormat
    source: str  # "capture" or the substitution file
    cubin: CubinInfo | None = None  # when the image is a readable cubin
    abi_checked: bool = False  # checked without a GPU from cubin metadata


@dataclass(frozen=True)
class ExecutableSources:
    """What choosing the executables' images reads: the capture, the options (substitutions), the
    captured devices (architecture checks) and the resolved file references."""

    capture: Capture
    options: PlanOptions
    devices: list[m.Device]
    files: dict[int, ResolvedFile]


def plan_executables(
    plan: ExecutableSources,
    objects: Mapping[int, m.ObjectDef],
    executables: dict[int, m.Executable],
    fail: Callable[[ReplayError], None],
    launched: dict[int, set[int]],
) -> dict[int, ExecutableImage]:
    """The image each captured executable will be loaded from (its payload or file, or a
    substitute), checked without a GPU against the capture's functions; a problem goes to ``fail``
    (which raises, or collects under --continue-on-error) and leaves that executable unusable."""
    images: dict[int, ExecutableImage] = {}
    subs = {s.target: s for s in plan.options.substitutions}
    for target in subs:
        if target is not None and target not in executables:
            what = (
                f"object {target} is a {objects[target].kind.label}, not an executable"
                if target in objects
                else (f"the capture has no object {target}")
            )
            raise ReplayUsageError(
                f"--executable-substitution {target}: {what}; "
                f"executables: {', '.join(map(str, sorted(executables))) or 'none'}"
            )
    captured_images: dict[tuple[int, int], bytes] = {}  # a recorder writes one executable per kernel of a module
    for eid, exe in executables.items():
        sub = subs.get(eid) or subs.get(None)
        try:
            if sub is None:
                key = (exe.payload, exe.file)
                if key not in captured_images:
                    captured_images[key] = _captured_image(plan, eid, exe)
                image = ExecutableImage(exe, captured_images[key], exe.format, "capture")
            else:
                try:
                    data = sub.path.read_bytes()
                except OSError as exc:
                    raise ReplayUsageError(
                        f"--executable-substitution {eid}: cannot read {sub.path} ({exc.strerror})"
                    ) from None
                try:
                    detected = EXECUTABLE_FORMATS[detect_format(data)]
                except CubinError as exc:
                    raise CubinError(f"--executable-substitution {eid}: {sub.path}: {exc}") from None
                if sub.format is not None and sub.format != detected:
                    raise ReplayUsageError(
                        f"--executable-substitution {eid}: {sub.path} is a {detected.name.lower()}, "
                        f"not a {sub.format.name.lower()}"
                    )
                image = ExecutableImage(exe, data, detected, str(sub.path))
            if image.format == m.ExecutableFormat.CUBIN and image.data[:4] == b"\x7fELF":
                try:
                    image.cubin = parse_cubin(image.data)
                except CubinError as exc:
                    if sub is not None:
                        raise CubinError(f"--executable-substitution {eid}: {sub.path}: {exc}") from None
                    # the captured image is for the driver to judge at load; only substitutes must parse
                if image.cubin is not None:
                    if sub is not None:
                        _check_substitute_arch(plan, eid, exe, image)
                    _check_cubin_abi(eid, exe, image, launched.get(eid, set()))
            images[eid] = image
        except (CubinError, AbiMismatchError, FileMismatchError, ReplayFormatError) as exc:
            fail(exc)
            images[eid] = ExecutableImage(exe, b"", exe.format, "unusable")
    if plan.options.jit_from_ptx:
        _from_ptx(images)
    return images


def image_targets(images: dict[int, ExecutableImage]) -> dict[int, CodeTargets]:
    """What each executable's image holds code for (read once per image), for the device check."""
    by_data: dict[int, CodeTargets] = {}
    out = {}
    for eid, image in images.items():
        if image.source == "unusable":
            continue
        if id(image.data) not in by_data:
            by_data[id(image.data)] = code_targets(image.data, image.format)
        out[eid] = by_data[id(image.data)]
    return out


def _from_ptx(images: dict[int, ExecutableImage]) -> None:
    """--jit-from-ptx: every image replaced by its PTX alone (a fatbin's PTX entries, or PTX text),
    so the driver JIT-compiles it as it would on a GPU no cubin is for; refused, naming them, when
    executables hold no PTX."""
    without = []
    by_data: dict[int, bytes | None] = {}  # executables of one module share its image
    for eid, image in images.items():
        if image.source == "unusable":
            continue
        if id(image.data) not in by_data:
            try:
                by_data[id(image.data)] = ptx_image(image.data)
            except CubinError:
                by_data[id(image.data)] = None
        ptx = by_data[id(image.data)]
        if ptx is None:
            without.append(eid)
            continue
        fmt = m.ExecutableFormat.PTX if ptx is image.data else m.ExecutableFormat.FATBIN  # (text, or a fatbin)
        images[eid] = ExecutableImage(image.executable, ptx, fmt, image.source)
    if without:
        shown = ", ".join(map(str, without[:12])) + (f" and {len(without) - 12} more" if len(without) > 12 else "")
        raise ReplayUsageError(
            f"--jit-from-ptx: {len(without)} executable(s) hold no PTX (only cubins): {shown}; "
            "dump-replay lists each executable's targets"
        )


def _check_substitute_arch(plan: ExecutableSources, eid: int, exe: m.Executable, image: ExecutableImage) -> None:
    """A cubin runs only on its own major architecture, at its minor version or newer: compare a
    substitute's with the captured executable's target (or, without one, the captured devices')."""
    assert image.cubin is not None
    have = divmod(image.cubin.arch, 10)
    target = re.fullmatch(r"sm_(\d+)(\d)[a-z]?", exe.target_arch or "")
    wanted = [(int(target[1]), int(target[2]))] if target else [d.compute_capability for d in plan.devices]
    for major, minor in wanted:
        if major and (have[0] != major or have[1] > minor):
            where = (
                f"the captured executable targets sm_{major}{minor}"
                if target
                else f"the capture's device is sm_{major}{minor}"
            )
            raise AbiMismatchError(
                f"executable {eid}: {image.source} is a cubin for sm_{have[0]}{have[1]}, but {where}: "
                f"it cannot run it (rebuild it with -arch=sm_{major}{minor})"
            )


def _captured_image(plan: ExecutableSources, eid: int, exe: m.Executable) -> bytes:
    """The bytes of a captured executable: its payload, or the file it was loaded from."""
    if exe.payload or not exe.file:
        if exe.payload and plan.capture.payload(exe.payload).size > plan.capture.limits.max_executable_size:
            raise ReplayUsageError(
                f"executable {eid}: payload {exe.payload} is {plan.capture.payload(exe.payload).size} bytes, "
                f"over Limits.max_executable_size ({plan.capture.limits.max_executable_size})"
            )
        return plan.capture.read_payload(exe.payload) if exe.payload else b""
    resolved = plan.files.get(exe.file)
    if resolved is None:
        raise FileMismatchError(f"executable {eid}: its file reference {exe.file} is unusable (see above)")
    ref = resolved.reference
    size = ref.size if resolved.path is not None else plan.capture.payload(ref.payload).size if ref.payload else 0
    if size > plan.capture.limits.max_executable_size:
        raise ReplayUsageError(f"executable {eid}: {size} bytes, over Limits.max_executable_size")
    if resolved.path is not None:  # a regular file of its recorded size, and an image of the captured kind
        try:
            data = read_reference(resolved.path, ref.size, exact=True)
            found = EXECUTABLE_FORMATS[detect_format(data)]
        except (FileMismatchError, CubinError):
            found = None
        if found is None or exe.format not in (m.ExecutableFormat.UNKNOWN, found):
            raise FileMismatchError(  # one message whatever is wrong with the file: no oracle
                f"executable {eid}: {ref.path} is not the {ref.size}-byte {exe.format.name.lower()} executable "
                f"image the capture recorded (file reference {exe.file}); give the right file with --file-remap"
            )
        return data
    if ref.payload:
        return plan.capture.read_payload(ref.payload)
    raise ReplayUsageError(f"executable {eid}: the capture holds no bytes of {ref.path}")


def _check_cubin_abi(eid: int, exe: m.Executable, image: ExecutableImage, launched: set[int]) -> None:
    """Every captured function the capture launches must exist in the image with the same layout
    (a substitute may leave out kernels the capture never launches)."""
    assert image.cubin is not None
    for index, fn in enumerate(exe.functions):
        if index not in launched:
            continue
        kernel = image.cubin.kernels.get(fn.name)
        if kernel is None:
            available = ", ".join(sorted(image.cubin.kernels)) or "none"
            raise AbiMismatchError(
                f"executable {eid}: function {fn.name} is missing from {image.source} (it has: {available})"
            )
        if fn.parameters_known:
            captured = [(p.offset, p.size) for p in fn.parameters]
            if captured != kernel.parameters:
                raise AbiMismatchError(layout_difference(eid, fn.name, captured, kernel.parameters, image.source))
    image.abi_checked = True


def layout_difference(
    eid: int, name: str, captured: list[tuple[int, int]], loaded: list[tuple[int, int]], source: str
) -> str:
    if len(captured) != len(loaded):
        detail = f"{len(captured)} parameters captured, {len(loaded)} in {source}"
    else:
        i = next(k for k, (a, b) in enumerate(zip(captured, loaded)) if a != b)
        detail = (
            f"parameter {i}: captured=(offset {captured[i][0]}, size {captured[i][1]}) "
            f"loaded=(offset {loaded[i][0]}, size {loaded[i][1]})"
        )
    return f"executable {eid}: function {name} has another ABI: {detail}"
