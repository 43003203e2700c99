"""What a capture may make the tools read, write and allocate (docs/FORMAT.md §5.3), checked one
rule at a time with exact messages: host paths, export directories, a file shrinking under the
reader, and payloads far larger than the file."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from click.testing import CliRunner
from hostile import _dedup_capture, _payload_capture

import replayfmt
from replayfmt.container.files import FileRemap, read_reference, remap_path, resolve_file
from replayfmt.errors import FileMismatchError, ReplayUsageError
from replayfmt.format import model as m
from replayfmt_tools.dump_replay import main as dump_main


def dump(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(dump_main, list(args))
    return result.exit_code, result.stdout, result.stderr


# -- host paths ------------------------------------------------------------------------------


def test_remap_is_confined_to_its_target_after_normalisation():
    remaps = [FileRemap.parse("/data=/safe/models")]
    assert remap_path("/data/w/../x.bin", remaps) == "/safe/models/x.bin"
    assert remap_path("/data", remaps) == "/safe/models"
    assert remap_path("/elsewhere/../etc/passwd", remaps) == "/elsewhere/../etc/passwd"  # no remap applies
    assert remap_path("/data/w.bin", [FileRemap.parse("/data=.")]) == "w.bin"  # a relative target
    assert remap_path("/data/w.bin", [FileRemap.parse("/data=models/")]) == "models/w.bin"
    with pytest.raises(ReplayUsageError, match=r"would leave models \(it normalises to x\)"):
        remap_path("/data/../x", [FileRemap.parse("/data=models")])
    for escape, lands in (("/data/../../../etc/passwd", "/etc/passwd"), ("/data/../models2/x", "/safe/models2/x")):
        with pytest.raises(ReplayUsageError) as info:
            remap_path(escape, remaps)
        assert str(info.value) == (
            f"--file-remap /data=/safe/models: the captured path {escape} would leave /safe/models "
            f"(it normalises to {lands}); refused"
        )


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_only_regular_files_are_opened(tmp_path, kind):
    path = {"fifo": tmp_path / "p", "device": "/dev/zero", "directory": tmp_path}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    ref = m.FileReference(id=3, path=str(path), size=0, validation=m.FileValidation.DIGEST, digest=bytes(16))
    with pytest.raises(FileMismatchError, match=rf"^file reference 3: cannot read {path}; .*: not a regular file"):
        resolve_file(ref)
    with pytest.raises(replayfmt.ReplayError, match="not a regular file"):
        read_reference(str(path), 10)


def test_mismatch_messages_name_the_captured_values_never_the_host_files(tmp_path):
    secret = tmp_path / "shadow"
    secret.write_bytes(b"s3cret" * 50)
    ref = m.FileReference(id=2, path=str(secret), size=4096, validation=m.FileValidation.DIGEST, digest=bytes(16))
    with pytest.raises(FileMismatchError) as info:
        resolve_file(ref)
    wrong_size = str(info.value)
    assert "300" not in wrong_size
    ref = m.FileReference(id=2, path=str(secret), size=300, validation=m.FileValidation.DIGEST, digest=bytes(16))
    with pytest.raises(FileMismatchError) as info:
        resolve_file(ref)
    # the same words whether the size or the content differs: no oracle of the host file's size
    assert str(info.value) == wrong_size.replace("4096", "300") and str(info.value).endswith(
        f"{secret}; if the files moved, use --file-remap=CAPTURED_PREFIX=NEW_PREFIX is not the captured file "
        f"(digest validation: its size and content must match the recorded {'0' * 32})"
    )


def test_reads_stop_at_the_recorded_size(tmp_path):
    path = tmp_path / "grows"
    path.write_bytes(b"a" * 10 + b"b" * 1000)
    assert read_reference(str(path), 10) == b"a" * 10
    with pytest.raises(replayfmt.ReplayError, match=r"is not the file the capture recorded \(5000 bytes\)"):
        read_reference(str(path), 5000)
    with pytest.raises(replayfmt.ReplayError, match=r"is not the file the capture recorded \(10 bytes\)"):
        read_reference(str(path), 10, exact=True)


# -- export directories ----------------------------------------------------------------------


def test_export_writes_once_skips_the_same_content_and_leaves_no_temporaries(tmp_path):
    path, digest = _payload_capture(tmp_path / "c.kreplay")
    out = tmp_path / "out"
    for _ in range(2):
        code, _, err = dump("--format=jsonl", f"--payloads=files:{out}", str(path))
        assert code == 0, err
        assert sorted(p.name for p in out.iterdir()) == [f"{digest}.bin"]
    assert (out / f"{digest}.bin").read_bytes() == np.arange(100_000, dtype=np.int32).tobytes()


def test_export_never_follows_or_replaces_what_is_there(tmp_path):
    path, digest = _payload_capture(tmp_path / "c.kreplay")
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    (out / f"{digest}.bin").symlink_to(victim)
    code, _, err = dump("--format=jsonl", f"--payloads=files:{out}", str(path))
    assert code == 2 and victim.read_bytes() == b"keep me"
    assert err == (
        f"dump-replay: error: --payloads=files:{out}: {digest}.bin exists and is not a regular file (a symlink?); "
        "it is left alone: remove it, or export to another --payloads=files:DIR\n"
    )
    (out / f"{digest}.bin").unlink()
    (out / f"{digest}.bin").write_bytes(bytes(400_000))
    code, _, err = dump("--format=jsonl", f"--payloads=files:{out}", str(path))
    assert code == 2 and f"{digest}.bin exists with other content; it is left alone" in err
    assert (out / f"{digest}.bin").read_bytes() == bytes(400_000)
    assert sorted(p.name for p in out.iterdir()) == [f"{digest}.bin"]


def test_export_to_an_unwritable_directory_is_one_line_before_any_row(tmp_path, monkeypatch):
    from replayfmt.dump import export

    path, _ = _payload_capture(tmp_path / "c.kreplay")
    real = os.open

    def read_only(name, flags, *args, **kwargs):
        if flags & os.O_CREAT:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real(name, flags, *args, **kwargs)

    monkeypatch.setattr(export.os, "open", read_only)
    code, out, err = dump("--format=jsonl", f"--payloads=files:{tmp_path}", str(path))
    assert code == 2 and out == ""
    assert err == (
        f"dump-replay: error: --payloads=files:{tmp_path}: cannot write in the directory "
        "(Read-only file system); choose a writable one\n"
    )


def test_a_failed_export_removes_its_temporary(tmp_path, monkeypatch):
    from replayfmt.dump import export

    path, _ = _payload_capture(tmp_path / "c.kreplay")
    out = tmp_path / "out"
    out.mkdir()
    real = os.pwrite

    def full(fd, data, offset):  # half the frame fits, then the disk is full
        if len(data) > 1000:
            return real(fd, data[: len(data) // 2], offset)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(export.os, "pwrite", full)
    with replayfmt.open(path) as cap:
        info = cap.payload(1)
        with pytest.raises(ReplayUsageError, match=rf"cannot write {info.hash_hex}.bin \(No space left on device\)"):
            export.export_payload(cap, info, out)
    assert list(out.iterdir()) == []


# -- payloads far larger than the file -------------------------------------------------------


def test_deduplicated_terabyte_is_refused_before_allocating(tmp_path):
    path = _dedup_capture(tmp_path / "tib.kreplay", 1 << 40, 64 << 20)
    with replayfmt.open(path) as cap:
        with pytest.raises(ReplayUsageError, match=r"payload 1: 1099511627776 bytes are more than read_payload"):
            cap.read_payload(1)
        assert cap.read_payload(1, (1 << 40) - 10, 10) == bytes(10)  # a range still reads
    code, _, err = dump("--format=jsonl", "--payloads=hex", str(path))
    assert code == 2 and err == (
        "dump-replay: error: payload 1 is 1099511627776 bytes, more than --payloads=hex inlines (67108864); "
        "export it with --payloads=files:DIR\n"
    )


# -- a file that shrinks while it is read -----------------------------------------------------


def test_a_file_shrinking_under_the_reader_is_an_error_not_sigbus(tmp_path):
    path = tmp_path / "shrinks.kreplay"
    with replayfmt.CaptureWriter(path, batch_operations=100) as w:
        exe = w.add_object(m.Executable(functions=(m.Function(name="k"),)))
        for i in range(2000):
            w.launch(executable=exe, function=0, grid=(i + 1, 1, 1), block=(1, 1, 1))
        w.add_payload(np.random.default_rng(0).bytes(1 << 20))
    script = textwrap.dedent(
        f"""
        import os, replayfmt
        with replayfmt.open({str(path)!r}) as cap:
            os.truncate({str(path)!r}, cap.size // 3)
            try:
                sum(1 for _ in cap)
            except replayfmt.ReplayFormatError as exc:
                print(exc)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr  # SIGBUS was exit -7 (135 from a shell)
    assert result.stdout.count("\n") == 1 and "(it shrank while it was read)" in result.stdout
    assert result.stdout.startswith(f"{path}: offset ")
