"""Code for a replay: every executable loaded on every device, its launched functions checked
against the captured ABI and launch shapes, module globals initialised, and PTX re-JITted with a
register cap for tuning."""

from __future__ import annotations

from typing import Any

from replayfmt.cuda.driver import CudaCallError, check
from replayfmt.cuda.functions import parameter_layout
from replayfmt.errors import AbiMismatchError, DeviceError, ReplayUsageError
from replayfmt.format import model as m
from replayfmt.replay.devices import Devices, ReplayDevice
from replayfmt.replay.executables import ExecutableImage, layout_difference
from replayfmt.replay.plan import Plan

FunctionKey = tuple[int, int]  # (executable id, function index)
_STATIC_SHARED = 48 * 1024  # dynamic shared memory above this must be opted in to
_PORTABLE_CLUSTER = 8  # blocks per cluster beyond this must be allowed (non-portable sizes)


class Modules:
    """The loaded functions of every device, and the images they came from (kept alive)."""

    def __init__(self, devices: Devices, plan: Plan) -> None:
        self.devices = devices
        self.plan = plan
        self.on_device: list[dict[FunctionKey, Any]] = []  # per device: function handles
        self.layouts: dict[FunctionKey, list[tuple[int, int]]] = {}  # live (offset, size) per parameter
        self._images: list[bytes] = []  # module images must outlive their modules
        self._loaded: list[dict[int, Any]] = []  # per device: executable id -> its loaded module
        # executable -> (register cap, threads hint) or None -> function handles
        self._jit_variants: dict[int, dict[tuple[int, int] | None, dict[FunctionKey, Any]]] = {}

    @property
    def functions(self) -> dict[FunctionKey, Any]:
        """The functions on the first device (where tuning works)."""
        return self.on_device[0]

    def load(self) -> None:
        """Load every executable on every device (the first stays current)."""
        initial_globals: dict[int, bytes] = {}  # read from the file once, uploaded on every device
        for k, gpu in enumerate(self.devices.gpus):
            self.devices.use(k)
            self.on_device.append(self._load_here(gpu, initial_globals))
        self.devices.use(0)

    def _load_here(self, gpu: ReplayDevice, initial_globals: dict[int, bytes]) -> dict[FunctionKey, Any]:
        """Load every executable into the current context; the launched functions, checked."""
        cu, plan = self.devices.cu, self.plan
        functions: dict[FunctionKey, Any] = {}
        # Executables that share an image (a recorder writes one per kernel of a module) share
        # one loaded module, as they shared it in the program: module globals stay common.
        loaded: dict[tuple[str, int, int], Any] = {}
        modules: dict[int, Any] = {}
        self._loaded.append(modules)
        for eid, image in plan.images.items():
            exe = image.executable
            key = (image.source, exe.payload, exe.file) if image.source == "capture" else (image.source, 0, 0)
            module = loaded.get(key)
            if module is None:
                module = loaded[key] = self._load_image(eid, image, gpu)
            modules[eid] = module
            for index, fn in enumerate(exe.functions):
                if (eid, index) not in plan.launches_of:
                    continue
                try:
                    handle = check(cu.cuModuleGetFunction(module, fn.name.encode()), "cuModuleGetFunction")
                except CudaCallError:
                    raise AbiMismatchError(f"executable {eid}: function {fn.name} is not in {image.source}") from None
                self.layouts[(eid, index)] = parameter_layout(cu, handle)
                self._check_abi(eid, index, handle, image.source)
                self._allow_launches(handle, eid, index, gpu)
                functions[(eid, index)] = handle
            for gid, glob in plan.globals.items():
                if glob.executable == eid and glob.initial_payload:
                    ptr, size = check(cu.cuModuleGetGlobal(module, glob.symbol.encode()), f"global {gid} {glob.symbol}")
                    if gid not in initial_globals:
                        initial_globals[gid] = plan.capture.read_payload(glob.initial_payload)
                    data_bytes = initial_globals[gid]
                    check(cu.cuMemcpyHtoD(ptr, data_bytes, min(size, len(data_bytes))), f"global {gid}: upload")
        return functions

    def global_storage(self) -> dict[int, int]:
        """Buffer id -> device address of every module global's storage (format 1.4): the
        global in the module loaded on the buffer's device. A substituted build must define the
        captured globals, at least as large."""
        cu, plan = self.devices.cu, self.plan
        addresses: dict[int, int] = {}
        for bid, buf in plan.buffers.items():
            glob = plan.module_global(buf)
            if glob is None:
                continue
            k = self.devices.index(buf.device)
            self.devices.use(k)
            source = plan.images[glob.executable].source
            try:
                address, size = check(
                    cu.cuModuleGetGlobal(self._loaded[k][glob.executable], glob.symbol.encode()), "cuModuleGetGlobal"
                )
            except CudaCallError:
                raise AbiMismatchError(
                    f"buffer {bid}: executable {glob.executable} ({source}) defines no global {glob.symbol}, "
                    "which the captured one did"
                ) from None
            if size < buf.size:
                raise AbiMismatchError(
                    f"buffer {bid}: global {glob.symbol} of executable {glob.executable} ({source}) holds "
                    f"{size} bytes; the capture's held {buf.size}"
                )
            addresses[bid] = int(address)
        self.devices.use(0)
        return addresses

    def _load_image(self, eid: int, image: ExecutableImage, gpu: ReplayDevice) -> Any:
        cu = self.devices.cu
        ptx = image.format == m.ExecutableFormat.PTX
        data = image.data + (b"\0" if ptx and not image.data.endswith(b"\0") else b"")
        try:
            module = check(cu.cuModuleLoadData(data), f"executable {eid} ({image.source}): cuModuleLoadData")
        except CudaCallError as exc:
            if exc.name == "CUDA_ERROR_NO_BINARY_FOR_GPU":
                raise DeviceError(
                    f"{exc}; the executable has no code for cuda:{gpu.ordinal} ({gpu.name}): substitute a build "
                    f"for sm_{gpu.arch} with --executable-substitution"
                ) from None
            raise
        self.devices.own(lambda mod=module: cu.cuModuleUnload(mod))
        self._images.append(data)
        return module

    def _check_abi(self, eid: int, index: int, handle: Any, source: str) -> None:
        """The loaded function must take the captured parameters and fit the captured launches."""
        cu = self.devices.cu
        fn = self.plan.images[eid].executable.functions[index]
        layout = self.layouts[(eid, index)]
        if fn.parameters_known:
            captured = [(p.offset, p.size) for p in fn.parameters]
            if captured != layout:
                raise AbiMismatchError(layout_difference(eid, fn.name, captured, layout, source))
        attribute = cu.CUfunction_attribute
        threads = check(cu.cuFuncGetAttribute(attribute.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, handle), "attribute")
        needed = self.plan.max_block_threads.get((eid, index), 0)
        if needed > threads:
            registers = check(cu.cuFuncGetAttribute(attribute.CU_FUNC_ATTRIBUTE_NUM_REGS, handle), "attribute")
            raise AbiMismatchError(
                f"executable {eid}: {fn.name} from {source} allows {threads} threads per block ({registers} "
                f"registers per thread); the capture launches it with {needed}"
            )

    def _allow_launches(self, handle: Any, eid: int, index: int, gpu: ReplayDevice) -> None:
        """Set the function attributes its captured launches need, as the program did: dynamic
        shared memory over 48 KiB, clusters over 8 blocks (cuBLAS's sm_90 GEMMs launch 16)."""
        cu = self.devices.cu
        name = self.plan.images[eid].executable.functions[index].name
        smem = self.plan.max_shared_memory.get((eid, index), 0)
        if smem > _STATIC_SHARED:
            if smem > gpu.max_shared_optin:
                raise DeviceError(
                    f"executable {eid}: {name} needs {smem} bytes of dynamic shared memory; cuda:{gpu.ordinal} "
                    f"({gpu.name}) allows {gpu.max_shared_optin}"
                )
            self._opt_in(handle, smem, f"executable {eid}: {name}: opting in to {smem} bytes of dynamic shared memory")
        if self.plan.max_cluster_blocks.get((eid, index), 1) > _PORTABLE_CLUSTER:
            attribute = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
            what = f"executable {eid}: {name}: allowing clusters over {_PORTABLE_CLUSTER} blocks"
            check(cu.cuFuncSetAttribute(handle, attribute, 1), what)

    def _opt_in(self, handle: Any, size: int, what: str) -> None:
        cu = self.devices.cu
        attribute = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        check(cu.cuFuncSetAttribute(handle, attribute, size), what)

    def opt_in_shared_memory(self, executable: int, function: int, size: int) -> None:
        """Allow a function of the first device ``size`` bytes of dynamic shared memory."""
        gpu = self.devices.gpus[0]
        if size > gpu.max_shared_optin:
            raise DeviceError(f"{size} bytes of dynamic shared memory: {gpu.name} allows {gpu.max_shared_optin}")
        self._opt_in(self.functions[(executable, function)], size, "cuFuncSetAttribute")

    def load_with_register_cap(
        self, executable: int, max_registers: int | None, threads_per_block: int = 0
    ) -> dict[int, Any]:
        """Re-JIT a PTX executable on the first device with a register cap and a threads-per-block
        hint (None: back to the image as loaded at setup). Returns ``id(old handle) -> new handle``
        for the caller to point its launches at; compiled variants are kept, so going back to one
        already tried costs nothing."""
        image = self.plan.images[executable]
        if image.format != m.ExecutableFormat.PTX:
            raise ReplayUsageError(
                f"executable {executable} is {image.format.name.lower()}, not PTX: only PTX can be re-JITted "
                "with a register cap"
            )
        original = {k: v for k, v in self.functions.items() if k[0] == executable}
        variants = self._jit_variants.setdefault(executable, {None: original})
        key = None if max_registers is None else (max_registers, threads_per_block)
        if key not in variants:
            variants[key] = self._jit(executable, image, max_registers, threads_per_block, list(variants[None]))
        new = variants[key]
        old_to_new = {id(self.functions[k]): handle for k, handle in new.items()}
        self.functions.update(new)
        return old_to_new

    def _jit(
        self, executable: int, image: ExecutableImage, max_registers: int | None, threads: int, keys: list[FunctionKey]
    ) -> dict[FunctionKey, Any]:
        cu = self.devices.cu
        data = image.data + (b"" if image.data.endswith(b"\0") else b"\0")
        options, values = [cu.CUjit_option.CU_JIT_MAX_REGISTERS], [max_registers]
        if threads:
            options.append(cu.CUjit_option.CU_JIT_THREADS_PER_BLOCK)
            values.append(threads)
        module = check(
            cu.cuModuleLoadDataEx(data, len(options), options, values),
            f"executable {executable}: JIT with at most {max_registers} registers",
        )
        self.devices.own(lambda: cu.cuModuleUnload(module))
        self._images.append(data)
        handles = {}
        for eid, index in keys:
            name = image.executable.functions[index].name
            handles[(eid, index)] = check(cu.cuModuleGetFunction(module, name.encode()), f"function {name}")
            self._allow_launches(handles[(eid, index)], eid, index, self.devices.gpus[0])
        return handles
