"""run-replay without a GPU: --dry-run and every error path CI can reach."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from samples import SAXPY, compiled_cubin, write_sample

import replayfmt
from replayfmt.container.files import identity_of
from replayfmt.format import model as m
from replayfmt.replay.plan import build_plan
from replayfmt.replay.plan_options import LaunchOverride, PlanOptions, Substitution
from replayfmt_tools.run_replay import main

ROOT = Path(__file__).resolve().parent.parent
GPU_KERNELS = ROOT / "tests" / "gpu" / "kernels"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def axpy_capture(path: Path, cubin: bytes | None, *, extra=None) -> dict[str, int]:
    """One axpy launch on integer-valued data, with a checkpoint."""
    n = 1024
    rng = np.random.default_rng(1)
    x = rng.integers(-50, 50, n).astype(np.float32)
    y = rng.integers(-50, 50, n).astype(np.float32)
    ids = {}
    with replayfmt.CaptureWriter(path, threads=0) as w:
        ids["dev"] = w.add_object(m.Device(name="test", compute_capability=(9, 0)))
        ids["x"] = w.add_object(m.Buffer(size=x.nbytes, dtype=m.DType.FLOAT32, shape=(n,)))
        ids["y"] = w.add_object(m.Buffer(size=y.nbytes, dtype=m.DType.FLOAT32, shape=(n,)))
        fn = m.Function(name="axpy", parameters=SAXPY.parameters, parameters_known=True)
        ids["exe"] = w.add_object(
            m.Executable(
                format=m.ExecutableFormat.CUBIN,
                target_arch="sm_90",
                payload=w.add_payload(cubin or b"\x7fELF" + bytes(60)),
                functions=(fn,),
            )
        )
        w.copy_h2d(dst_buffer=ids["x"], data=x)
        w.copy_h2d(dst_buffer=ids["y"], data=y)
        params = np.float32(3).tobytes() + bytes(20) + np.int32(n).tobytes() + bytes(4)
        ids["launch"] = w.launch(
            executable=ids["exe"],
            function=0,
            grid=(n // 256, 1, 1),
            block=(256, 1, 1),
            parameters=params,
            relocations=[m.Relocation(0, ids["x"], 8, 0), m.Relocation(0, ids["y"], 16, 0)],
        )
        if extra:
            extra(w, ids)
        w.checkpoint({ids["y"]: (3 * x + y).astype(np.float32)})
    return ids


@pytest.fixture
def cubins() -> dict[str, bytes]:
    return {  # the checked-in fixtures
        name: compiled_cubin(GPU_KERNELS / f"{name}.cu")
        for name in ("replay_kernels", "replay_kernels_same_abi", "replay_kernels_other_abi")
    }


def test_dry_run_plans_without_a_gpu(tmp_path, cubins):
    path = tmp_path / "a.kreplay"
    axpy_capture(path, cubins["replay_kernels"])
    code, out, err = run("--dry-run", str(path))
    assert code == 0, err
    assert "ABI checked from cubin metadata" in out and "dry run: plan OK" in out


def test_dry_run_accepts_a_same_abi_substitution(tmp_path, cubins):
    path = tmp_path / "a.kreplay"
    ids = axpy_capture(path, cubins["replay_kernels"])
    sub = tmp_path / "same.cubin"
    sub.write_bytes(cubins["replay_kernels_same_abi"])
    code, out, err = run("--dry-run", f"--executable-substitution={ids['exe']}={sub}", str(path))
    assert code == 0, err
    assert f"from {sub}" in out


def test_dry_run_refuses_another_abi_naming_the_first_difference(tmp_path, cubins):
    path = tmp_path / "a.kreplay"
    ids = axpy_capture(path, cubins["replay_kernels"])
    sub = tmp_path / "other.cubin"
    sub.write_bytes(cubins["replay_kernels_other_abi"])
    code, _, err = run("--dry-run", f"--executable-substitution={ids['exe']}@cubin={sub}", str(path))
    assert code == 1
    assert "function axpy has another ABI: parameter 3: captured=(offset 24, size 4) loaded=(offset 24, size 8)" in err


def test_substitution_missing_function_is_refused(tmp_path, cubins):
    path = tmp_path / "a.kreplay"
    ids = axpy_capture(path, cubins["replay_kernels"])
    sub = tmp_path / "c.cubin"
    sub.write_bytes(compiled_cubin("container_kernels.cu"))
    code, _, err = run("--dry-run", f"--executable-substitution={ids['exe']}={sub}", str(path))
    assert code == 1 and "function axpy is missing from" in err and "gather" in err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--executable-substitution=all=a.cubin", "--executable-substitution=1=b.cubin"], "cannot be combined"),
        (["--executable-substitution=5=a", "--executable-substitution=5=b"], "substituted twice"),
        (["--executable-substitution=x=a"], "is not an executable id"),
        (["--executable-substitution=5@elf=a"], "format must be cubin, ptx or fatbin"),
        (["--executable-substitution=2=/no/such.cubin"], "not an executable"),
        (["--executable-substitution=4=/no/such.cubin"], "cannot read /no/such.cubin"),
        (["--file-remap=nothing"], "expected CAPTURED_PREFIX=NEW_PREFIX"),
        (["--launch=5:grid=0"], "dimensions must be >= 1"),
        (["--launch=5:warp=2"], "unknown setting"),
        (["--launch=2:grid=1"], "is a create, not a launch"),
        (["--launch=999:grid=1"], "operation 999 is not in the capture"),
        (["--device=gpu0"], "expected cuda:N"),
    ],
)
def test_bad_flags_are_one_line_usage_errors(tmp_path, flags, message):
    path = tmp_path / "a.kreplay"
    axpy_capture(path, None)
    code, _, err = run("--dry-run", *flags, str(path))
    assert code == 2, err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_launch_override_is_validated_against_limits(tmp_path):
    path = tmp_path / "a.kreplay"
    ids = axpy_capture(path, None)
    code, _, err = run("--dry-run", f"--launch={ids['launch']}:block=2048", str(path))
    assert code == 1 and "block dimension 0 is 2048, outside [1, 1024]" in err
    code, out, _ = run("--dry-run", f"--launch={ids['launch']}:grid=8,block=128", str(path))
    assert code == 0 and "override      operation" in out


def test_unsupported_operation_is_refused_before_anything_runs(tmp_path):
    path = tmp_path / "u.kreplay"
    axpy_capture(path, None, extra=lambda w, ids: w.unsupported("cuLaunchHostFunc", "host callback"))
    code, _, err = run("--dry-run", str(path))
    assert code == 1 and "cuLaunchHostFunc cannot be replayed (host callback)" in err


def test_continue_on_error_reports_every_problem(tmp_path):
    path = tmp_path / "u.kreplay"

    def extra(w, ids):
        w.unsupported("cuLaunchHostFunc", "host callback")
        w.unsupported("cuIpcOpenMemHandle", "IPC")

    axpy_capture(path, None, extra=extra)
    code, _, err = run("--dry-run", "--continue-on-error", str(path))
    assert code == 1 and "cuLaunchHostFunc" in err and "cuIpcOpenMemHandle" in err


def _file_capture(tmp_path: Path, validation: m.FileValidation) -> tuple[Path, Path]:
    data_dir = tmp_path / "real"
    data_dir.mkdir()
    weights = data_dir / "w.bin"
    weights.write_bytes(np.arange(256, dtype=np.float32).tobytes())
    identity = identity_of(str(weights))
    from replayfmt.container.files import file_digest

    path = tmp_path / "f.kreplay"
    with replayfmt.CaptureWriter(path) as w:
        buf = w.add_object(m.Buffer(size=1024))
        ref = w.add_object(
            m.FileReference(
                path="/captured/root/w.bin", validation=validation, digest=file_digest(str(weights)), **identity
            )
        )
        w.copy_h2d(dst_buffer=buf, src_file=ref, src_offset=0, size=1024)
    return path, data_dir


def test_file_remap_then_identity_validation(tmp_path):
    path, data_dir = _file_capture(tmp_path, m.FileValidation.IDENTITY)
    code, _, err = run("--dry-run", str(path))
    assert code == 1 and "/captured/root/w.bin" in err and "--file-remap" in err
    code, _, err = run("--dry-run", f"--file-remap=/captured/root={data_dir}", str(path))
    assert code == 0, err
    os.utime(data_dir / "w.bin", ns=(1, 1))
    code, _, err = run("--dry-run", f"--file-remap=/captured/root={data_dir}", str(path))
    assert code == 1 and "not the captured file (identity validation" in err


def test_file_remap_then_digest_validation(tmp_path):
    path, data_dir = _file_capture(tmp_path, m.FileValidation.DIGEST)
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "w.bin").write_bytes((data_dir / "w.bin").read_bytes())
    code, _, err = run(
        "--dry-run", f"--file-remap=/captured={copy.parent}", f"--file-remap=/captured/root={copy}", str(path)
    )
    assert code == 0, err
    (copy / "w.bin").write_bytes(b"\x00" * 1024)
    code, _, err = run("--dry-run", f"--file-remap=/captured/root={copy}", str(path))
    assert code == 1 and "not the captured file (digest validation" in err


def test_no_gpu_is_a_clean_environment_error(tmp_path):
    path = tmp_path / "a.kreplay"
    axpy_capture(path, None)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    result = subprocess.run(
        [sys.executable, "-m", "replayfmt_tools.run_replay", str(path)], capture_output=True, text=True, env=env
    )
    # CUDA_VISIBLE_DEVICES="" hides every GPU, on any machine: exit 0 here is a bug, never a skip
    assert result.returncode == 2, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("run-replay: error: ")
    assert "Traceback" not in result.stderr


def test_plan_library_api(tmp_path):
    path = tmp_path / "s.kreplay"
    write_sample(path)
    with replayfmt.open(path) as cap:
        with pytest.raises(replayfmt.FileMismatchError, match=r"/data/weights\.bin"):
            build_plan(cap)
        plan = build_plan(cap, PlanOptions(continue_on_error=True))
        assert plan.buffer_bytes == 8192
        assert any("cuLaunchHostFunc" in p for p in plan.problems) and any("weights" in p for p in plan.problems)
        assert LaunchOverride.parse("3:grid=2,block=64,smem=0") == LaunchOverride(3, (2, 1, 1), (64, 1, 1), 0)
        assert Substitution.parse("all@ptx=k.ptx").target is None


def test_help_states_the_failure_contract():
    result = subprocess.run(
        [sys.executable, "-m", "replayfmt_tools.run_replay", "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0 and "Failure contract" in result.stdout and "--dry-run" in result.stdout


def test_nvtx_library_missing_is_an_environment_error(monkeypatch):
    from replayfmt.cuda import nvtx

    monkeypatch.setattr(nvtx, "_candidates", lambda: ["/nonexistent/libnvToolsExt.so"])
    monkeypatch.setitem(sys.modules, "torch", None)  # no PyTorch to fall back on
    with pytest.raises(replayfmt.DeviceUnavailableError, match="libnvToolsExt"):
        nvtx.Nvtx.load()


def test_a_dangling_object_id_is_a_format_error(tmp_path):
    path = tmp_path / "d.kreplay"
    ids = axpy_capture(path, None, extra=lambda w, ids: w.copy_d2d(src_buffer=ids["x"], dst_buffer=99, size=16))
    code, _, err = run("--dry-run", str(path))
    assert code == 2 and err.count("\n") == 1
    assert f"operation {ids['launch'] + 1} (copy_d2d): its destination object 99 does not exist, not a buffer" in err


def test_file_bytes_that_were_not_captured_are_a_file_mismatch(tmp_path):
    path = tmp_path / "r.kreplay"
    with replayfmt.CaptureWriter(path) as w:
        buf = w.add_object(m.Buffer(size=64))
        ranges = (m.FileRange(offset=0, size=64, payload=w.add_payload(bytes(64))),)
        ref = w.add_object(m.FileReference(path="/gone/w.bin", policy=m.FilePolicy.CAPTURE_RANGES, ranges=ranges))
        w.copy_h2d(dst_buffer=buf, src_file=ref, src_offset=0, size=64)
        w.copy_h2d(dst_buffer=buf, src_file=ref, src_offset=32, size=64)
    with replayfmt.open(path) as cap, pytest.raises(replayfmt.FileMismatchError) as raised:
        build_plan(cap)
    assert str(raised.value) == (
        "operation 3: file bytes [32, 96) of /gone/w.bin were not captured (policy capture-ranges) and the file is "
        "not here: give it with --file-remap"
    )


def test_the_plan_knows_which_functions_launch_large_clusters(tmp_path):
    """Clusters over 8 blocks need the function's non-portable-size attribute at replay, as the
    program set it (cuBLAS's sm_90 GEMMs launch clusters of 16)."""
    path = tmp_path / "clusters.kreplay"
    with replayfmt.CaptureWriter(path) as w:
        dev = w.add_object(m.Device(name="test", compute_capability=(9, 0)))
        fn = m.Function(name="gemm", parameters=(), parameters_known=True)
        exe = w.add_object(
            m.Executable(format=m.ExecutableFormat.CUBIN, payload=w.add_payload(b"\0" * 64), functions=(fn, fn))
        )
        w.module_load(exe, dev)
        for function, cluster in ((0, (2, 8, 1)), (0, (1, 2, 1)), (1, (0, 0, 0))):
            w.launch(executable=exe, function=function, grid=(16, 8, 1), block=(128, 1, 1), cluster=cluster)
    with replayfmt.open(path) as cap:
        plan = build_plan(cap, PlanOptions(continue_on_error=True))
    assert plan.max_cluster_blocks == {(exe, 0): 16, (exe, 1): 1}


def test_functions_get_the_attributes_their_launches_need(monkeypatch):
    """Over 48 KiB of dynamic shared memory is opted in to and clusters over 8 blocks are
    allowed, as the program did; a cluster of 8 needs nothing."""
    from types import SimpleNamespace

    from replayfmt.cuda import driver as driver_module
    from replayfmt.replay.modules import Modules

    calls = []
    attribute = SimpleNamespace(
        CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES="smem",
        CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED="big",
    )
    cu = SimpleNamespace(
        CUresult=SimpleNamespace(CUDA_SUCCESS=0),
        CUfunction_attribute=attribute,
        cuFuncSetAttribute=lambda handle, what, value: calls.append((handle, what, value)) or (0,),
    )
    monkeypatch.setattr(driver_module, "driver", lambda: cu)
    functions = (m.Function(name="gemm"), m.Function(name="small"))
    plan = SimpleNamespace(
        images={3: SimpleNamespace(executable=SimpleNamespace(functions=functions))},
        max_shared_memory={(3, 0): 231424, (3, 1): 1024},
        max_cluster_blocks={(3, 0): 16, (3, 1): 8},
    )
    gpu = SimpleNamespace(ordinal=0, name="H100", max_shared_optin=232448)
    modules = Modules(SimpleNamespace(cu=cu), plan)  # type: ignore[arg-type]
    modules._allow_launches("gemm handle", 3, 0, gpu)
    modules._allow_launches("small handle", 3, 1, gpu)
    assert calls == [("gemm handle", "smem", 231424), ("gemm handle", "big", 1)]
    gpu.max_shared_optin = 100_000
    with pytest.raises(replayfmt.DeviceError, match=r"gemm needs 231424 bytes .* cuda:0 \(H100\) allows 100000"):
        modules._allow_launches("gemm handle", 3, 0, gpu)
