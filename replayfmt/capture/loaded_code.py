"""The code the program loaded, as the CUPTI source finds it: which module or library a launched
function came from, the cubins the driver reported loading, and the globals those define.

Code comes from two places. Loads the program makes itself (cuModuleLoad*, cuLibraryLoad*)
give a handle and the image. Libraries load their modules lazily, one cubin at a time, with no
driver call of their own: CUPTI's resource domain reports each such cubin, and a launched
function whose module was never loaded by a visible call is matched by symbol name to the
cubins loaded so far.

A module's globals (``__device__`` and ``__constant__`` variables) are named by the symbol table
of the cubin the driver loaded, and found in the program's module with ``cuModuleGetGlobal``,
once per module, before its first launch reaches the sink: the host may have written them
(cuFFT keeps a base pointer there), and its kernels read them without naming them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from replayfmt.capture import events as ev
from replayfmt.capture.cupti_api import RESOURCE_MODULE_LOADED, RESOURCE_MODULE_UNLOAD_STARTING
from replayfmt.format.cubin import CubinError, Variable, module_variables

ModuleKey = tuple[str, int]  # ("module", CUmodule), ("library", CUlibrary) or ("loaded", CUPTI module id)


class LoadedCode:
    """What the source knows of loaded code; ``sink`` receives ModuleImage and ModuleGlobals."""

    def __init__(self, cu: Any, sink: Callable[[ev.Event], None]) -> None:
        self.cu = cu
        self._sink = sink
        self._loaded: set[ModuleKey] = set()  # module and library keys seen loading
        self._library_modules: dict[ModuleKey, int] = {}  # library key -> its module handle
        self._lazy_images: dict[int, bytes] = {}  # CUPTI module id -> cubin, loaded with no call of its own
        self._lazy_sent: set[int] = set()
        # the globals of the few cubins that define any: those the driver reported, by
        # ("loaded", CUPTI module id), and those the program loaded itself, by their key
        self._variables: dict[ModuleKey, list[Variable]] = {}
        self._globals_sent: set[ModuleKey] = set()  # modules whose globals the sink has
        self._module_keys: dict[int, ModuleKey] = {}  # CUmodule handle -> the key its kernels resolved to
        # lazily loaded modules the driver unloaded: the resource callback runs inside the
        # driver's unload, without the source's lock, so the sink hears of them later
        self.unloads: list[ModuleKey] = []

    def resource(self, cbid: int, module_id: int, image: Callable[[], bytes] | None) -> None:
        """A resource-domain module event: ``image`` reads the cubin of one just loaded."""
        if cbid == RESOURCE_MODULE_LOADED and image is not None:
            cubin = self._lazy_images[module_id] = image()
            self._note_variables(("loaded", module_id), cubin)
        elif cbid == RESOURCE_MODULE_UNLOAD_STARTING:
            self._lazy_images.pop(module_id, None)
            self._variables.pop(("loaded", module_id), None)
            if module_id in self._lazy_sent:  # the sink had it: told at the next driver call (take_unloads)
                self._lazy_sent.discard(module_id)
                self.unloads.append(("loaded", module_id))

    def loaded(self, image: ev.ModuleImage) -> None:
        """The program loaded an image (or a lazy one is first needed): the sink gets it."""
        self._loaded.add(image.key)
        self._library_modules.pop(image.key, None)
        if image.key[0] != "loaded":  # (a lazy one's globals were noted as the driver reported it)
            self._variables.pop(image.key, None)
            if image.data is not None:  # a cubin names its own (a fatbin's or PTX's: the driver's cubin)
                self._note_variables(image.key, image.data)
        self._sink(image)

    def _note_variables(self, key: ModuleKey, image: bytes) -> None:
        """Keep the globals ``image`` defines, if it is a cubin that defines any."""
        try:
            variables = module_variables(image)
        except CubinError:  # not an ELF image: it defines no globals the recorder can name
            return
        if variables:
            self._variables[key] = variables

    def take_unloads(self) -> list[ModuleKey]:
        """Tell the sink of the lazily loaded modules unloaded since the last call (under the
        source's lock); their keys."""
        keys, self.unloads = self.unloads, []
        for key in keys:
            self._sink(ev.ModuleUnload(key))
            self.unloaded(key)
        return keys

    def unloaded(self, key: ModuleKey) -> None:
        self._loaded.discard(key)
        self._globals_sent.discard(key)
        self._variables.pop(key, None)
        for handle in [h for h, k in self._module_keys.items() if k == key]:
            del self._module_keys[handle]

    def module_of(self, handle: int, name: str) -> tuple[ModuleKey | None, Any]:
        """(the key of the code ``handle`` came from, the driver's parameter-info query for it);
        the globals of that code go to the sink first, the first time one of its kernels runs."""
        cu = self.cu
        err, module = cu.cuFuncGetModule(handle)
        key: ModuleKey | None
        if err == cu.CUresult.CUDA_SUCCESS:  # a CUfunction (driver API, Triton)
            key = ("module", int(module))
            if key not in self._loaded:
                key = self._library_of(int(module))
            info = cu.cuFuncGetParamInfo
        else:  # a CUkernel (runtime API launches): its library
            err, library = cu.cuKernelGetLibrary(handle)
            key = ("library", int(library)) if err == cu.CUresult.CUDA_SUCCESS else None
            info = cu.cuKernelGetParamInfo
            # its module in this context: a lazy one loads now, and the resource domain reports it
            err, function = cu.cuKernelGetFunction(handle)
            if err == cu.CUresult.CUDA_SUCCESS:
                err, module = cu.cuFuncGetModule(function)
            module = module if err == cu.CUresult.CUDA_SUCCESS else None
        if key is None or key not in self._loaded:
            key = self._lazily_loaded(name)
        if key is not None and module is not None:
            self._module_keys[int(module)] = key
            if key not in self._globals_sent and self._variables:
                self._send_globals(key, name, module)
        return key, info

    def looked_up(self, handle: ModuleKey, symbol: str) -> None:
        """The program asked where a global lives (``handle``: ("module", CUmodule) or
        ("library", CUlibrary)): the sink learns of that global now, as the host may write it
        before any kernel of its module runs."""
        cu = self.cu
        kind, raw = handle
        if kind == "library":
            key: ModuleKey | None = handle if handle in self._loaded else None
            err, address, size = cu.cuLibraryGetGlobal(raw, symbol.encode())
        else:  # a module the program loaded, a library's, or one a kernel of it already ran from
            key = handle if handle in self._loaded else self._library_of(raw) or self._module_keys.get(raw)
            err, address, size = cu.cuModuleGetGlobal(raw, symbol.encode())
        if key is not None and err == cu.CUresult.CUDA_SUCCESS and int(address) and size:
            self._sink(ev.ModuleGlobals(key, (ev.GlobalVariable(symbol, int(address), int(size)),)))

    def _send_globals(self, key: ModuleKey, name: str, module: Any) -> None:
        """Tell the sink, once per module, where the globals of the module defining ``name``
        live (the driver's cubin of it, as the resource domain reported it, names them)."""
        self._globals_sent.add(key)
        variables = self._variables.get(key)
        if variables is None and key[0] != "loaded":  # the driver's cubin of a fatbin or of PTX: the
            symbol = b"\0" + name.encode() + b"\0"  # latest one reported that defines the kernel
            found = (
                v
                for k, v in reversed(self._variables.items())
                if k[0] == "loaded" and symbol in self._lazy_images[k[1]]
            )
            variables = next(found, None)
        cu = self.cu
        storage = []
        for variable in variables or ():
            err, address, size = cu.cuModuleGetGlobal(module, variable.name.encode())
            if err == cu.CUresult.CUDA_SUCCESS and int(address) and size:
                initial = variable.initial if variable.size == size else None
                storage.append(ev.GlobalVariable(variable.name, int(address), int(size), initial))
        if storage:
            self._sink(ev.ModuleGlobals(key, tuple(storage)))

    def _library_of(self, module: int) -> ModuleKey | None:
        """The library whose module ``module`` is (functions taken from a library's kernels)."""
        cu = self.cu
        for key in list(self._loaded):  # cuLibraryGetModule may load a lazy module: _loaded grows
            if key[0] == "library" and key not in self._library_modules:
                err, owned = cu.cuLibraryGetModule(key[1])
                self._library_modules[key] = int(owned) if err == cu.CUresult.CUDA_SUCCESS else 0
        for key, owned in list(self._library_modules.items()):
            if owned == module and key in self._loaded:
                return key
        return None

    def _lazily_loaded(self, name: str) -> ModuleKey | None:
        """The most recent cubin the driver loaded with no call of its own (a library's lazy
        module) that defines ``name``; sent to the sink the first time a launch needs it."""
        symbol = b"\0" + name.encode() + b"\0"
        for module_id in reversed(list(self._lazy_images)):
            image = self._lazy_images[module_id]
            if symbol in image:
                key = ("loaded", module_id)
                if module_id not in self._lazy_sent:
                    self._lazy_sent.add(module_id)
                    self.loaded(ev.ModuleImage(key, image, None, "module loaded lazily by a library"))
                return key
        return None
