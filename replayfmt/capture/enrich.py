"""Framework metadata for captures: Triton's argument names and kinds, PyTorch tensor types; and
the guards that turn off the program's own CUPTI clients (:mod:`profilers`).

Each hook is installed only when its framework is already imported, through the framework's own
hook mechanism (Triton's hook chains with add/remove, a PyTorch dispatch mode), and every
installer returns the function that removes it, so other tools keep working.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

from replayfmt.capture import profilers
from replayfmt.capture.allocations import TensorLabel
from replayfmt.capture.labels import KernelAnnotation, dtype_of
from replayfmt.capture.translate import Translator
from replayfmt.format import model as m


def tensor_label(tensor: Any, name: str = "") -> TensorLabel | None:
    """A label for a device tensor; None for anything else."""
    try:
        if not getattr(tensor, "is_cuda", False):
            return None
        storage = tensor.untyped_storage() if hasattr(tensor, "untyped_storage") else None
        size = storage.nbytes() if storage is not None else tensor.nbytes
        address = storage.data_ptr() if storage is not None else tensor.data_ptr()
        return TensorLabel(
            address, size, dtype_of(str(tensor.dtype)), tuple(tensor.shape), tuple(tensor.stride()), name
        )
    except Exception:
        return None


def triton_annotation(signature: dict[str, Any], arg_names: list[str]) -> KernelAnnotation:
    """Names, kinds and dtypes of the parameters a Triton kernel receives: its non-constexpr
    arguments, in order (names are left out when a tensor descriptor expands into several)."""
    kept = [n for n in arg_names if str(signature.get(n, "")) != "constexpr"]
    types = [str(signature.get(n, "")) for n in kept]
    kinds, dtypes = [], []
    for t in types:
        if t.startswith("tensordesc"):
            kinds.append(m.ParameterKind.TENSOR_MAP)
            dtypes.append(m.DType.UNKNOWN)
        elif t.startswith("*"):
            kinds.append(m.ParameterKind.POINTER)
            dtypes.append(dtype_of(t))
        else:
            kinds.append(m.ParameterKind.VALUE)
            dtypes.append(dtype_of(t))
    if any(k == m.ParameterKind.TENSOR_MAP for k in kinds):
        return KernelAnnotation(tensor_maps=True)  # a descriptor expands into several parameters
    return KernelAnnotation(tuple(kept), tuple(kinds), tuple(dtypes))


def _install_triton(translator: Translator) -> Callable[[], None] | None:
    triton = sys.modules.get("triton")
    knobs = getattr(triton, "knobs", None) if triton is not None else None
    runtime = getattr(knobs, "runtime", None)
    if runtime is None or not hasattr(runtime, "jit_post_compile_hook"):
        return None

    def on_compile(*args: Any, **kwargs: Any) -> None:
        try:
            fn = kwargs.get("fn")
            jit = getattr(fn, "jit_function", None)
            compile_info = kwargs.get("compile") or {}
            names = list(getattr(jit, "arg_names", []) or [])
            name = getattr(getattr(jit, "fn", None), "__name__", None) or getattr(fn, "name", "")
            if name and names:
                signature = dict(compile_info.get("signature", {}))
                translator.annotate_kernel(None, name, triton_annotation(signature, names))
        except Exception as exc:  # never break the program's compilation
            translator.report.errors.append(f"Triton metadata: {type(exc).__name__}: {exc}")
        return None

    hook = runtime.jit_post_compile_hook
    if hasattr(hook, "add") and hasattr(hook, "remove"):  # a hook chain
        hook.add(on_compile)
        return lambda: hook.remove(on_compile)
    previous = hook

    def chained(*args: Any, **kwargs: Any) -> Any:
        on_compile(*args, **kwargs)
        return previous(*args, **kwargs) if previous is not None else None

    runtime.jit_post_compile_hook = chained

    def restore() -> None:
        if runtime.jit_post_compile_hook is chained:
            runtime.jit_post_compile_hook = previous

    return restore


def _install_torch(translator: Translator) -> Callable[[], None] | None:
    if not translator.options.label_tensors or "torch" not in sys.modules:
        return None
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class TensorLabeler(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            for value in tree_flatten((args, kwargs, out))[0]:
                label = tensor_label(value)
                if label is not None:
                    translator.label_tensor(label)
            return out

    mode = TensorLabeler()
    mode.__enter__()
    return lambda: mode.__exit__(None, None, None)


def _install_torch_frees(translator: Translator) -> Callable[[], None] | None:
    """PyTorch's caching allocator frees a tensor's block with no driver call; its GPU trace (the
    hooks torch.cuda._sanitizer uses) tells each free while the block still counts as allocated,
    so its size can be asked. A block the open scope's launches pointed at is handed to the
    translator (release_block), which compares it at the scope's end if no launch followed the
    free: a step's dropped result. Without the trace, the translator compares what a step wrote
    into free memory instead (free_writes), as it does for JAX."""
    if "torch" not in sys.modules:
        return None
    import torch

    trace = _torch_gpu_trace()
    activate = getattr(getattr(torch, "_C", None), "_activate_gpu_trace", None)  # PyTorch's, not ours
    # the registry: MemoryDeallocationCallbacks since PyTorch 2.1 (torch.cuda._gpu_trace), before it
    # CUDAMemoryDeallocationCallbacks (torch.utils._cuda_trace)
    callbacks = getattr(trace, "MemoryDeallocationCallbacks", None) or getattr(
        trace, "CUDAMemoryDeallocationCallbacks", None
    )
    register = getattr(trace, "register_callback_for_memory_deallocation", None)
    if activate is None or callbacks is None or register is None:
        # a PyTorch without the GPU trace: what its launches write into free memory is compared instead
        translator.report.notes.append(
            "PyTorch's GPU trace has no memory-deallocation callbacks here: a step's dropped results are "
            "compared as what it wrote into free memory (a bounded range from each pointer)"
        )
        return None

    def freed(pointer: int) -> None:
        if not translator.points_at(pointer):  # one set lookup for every block the program frees
            return
        size = torch_block_size(torch.cuda.memory_snapshot(), pointer)
        if size:
            translator.release_block(pointer, size, "freed by PyTorch's caching allocator")

    switched: list[bool] = []

    def switch_on() -> None:
        # at the first step recorded: once active, PyTorch calls into Python at every allocation,
        # free, event and synchronisation, and cannot turn it off; a program recorded whole never pays
        if not switched:
            switched.append(True)
            register(freed)
            activate()

    translator.frees_heard.add("torch")  # its blocks freed in a step are compared exactly, its temporaries let go
    translator.step_hooks.append(switch_on)
    if translator.in_named_region:  # the program imported PyTorch inside the step
        switch_on()

    def remove() -> None:
        translator.frees_heard.discard("torch")
        if switch_on in translator.step_hooks:
            translator.step_hooks.remove(switch_on)
        if freed in callbacks.callback_list:
            callbacks.callback_list.remove(freed)

    return remove


def _torch_gpu_trace() -> Any:
    for name in ("torch.cuda._gpu_trace", "torch.utils._cuda_trace"):  # (renamed in PyTorch 2.1)
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


def torch_block_size(segments: list[dict[str, Any]], pointer: int) -> int:
    """The bytes the tensor freed at ``pointer`` asked for (``torch.cuda.memory_snapshot()``'s
    block there, still allocated while the free is traced), or 0 when no allocated block starts
    there."""
    for segment in segments:
        start = segment["address"]
        if not start <= pointer < start + segment["total_size"]:
            continue
        for block in segment.get("blocks", ()):
            if block["address"] == pointer and block["state"] != "inactive":
                return int(block.get("requested_size") or block["size"])
    return 0


def _install_proton(translator: Translator) -> Callable[[], None] | None:
    return profilers.install_proton(translator.report.notes)


def _install_torch_profiler(translator: Translator) -> Callable[[], None] | None:
    return profilers.install_torch_profiler(translator.report.notes)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``install`` once module ``name`` is imported: under ``python -m replayfmt.capture``
    the recorder starts before the program imports its frameworks."""

    def __init__(self, name: str, install: Callable[[], None]) -> None:
        self.name, self.install = name, install

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        self.remove()
        spec = importlib.util.find_spec(fullname)  # from the other finders
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            self.install()

        loader.exec_module = exec_module
        return spec

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def enrich(translator: Translator) -> list[Callable[[], None]]:
    """Install the hooks of the frameworks present, and of the others once the program imports
    them; returns their removers (the list grows as frameworks are imported)."""
    removers: list[Callable[[], None]] = []

    def install(installer: Callable[[Translator], Callable[[], None] | None]) -> None:
        try:
            remove = installer(translator)
        except Exception as exc:
            translator.report.errors.append(f"{installer.__name__}: {type(exc).__name__}: {exc}")
            return
        if remove is not None:
            removers.append(remove)

    wanted = [("triton", _install_triton)] + ([("torch", _install_torch)] if translator.options.label_tensors else [])
    wanted.append(("torch", _install_torch_frees))
    wanted += [("triton.profiler", _install_proton), ("torch.profiler", _install_torch_profiler)]
    for name, installer in wanted:
        if name in sys.modules:
            install(installer)
        else:
            hook = _AfterImport(name, lambda installer=installer: install(installer))
            sys.meta_path.insert(0, hook)
            removers.append(hook.remove)
    return removers
