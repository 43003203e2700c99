"""Byte layout of the .kreplay container: file header, chunk headers, footer, limits.

No I/O here: only constants, fixed-size structures and their checked (un)packing. The format is
specified in docs/FORMAT.md; this module is its executable form.

    file   := FileHeader  Chunk*  [INDEX Chunk  Footer]
    Chunk  := ChunkHeader  body (stored_size bytes)  zero padding to a multiple of 8

All integers are little-endian. Checksums are XXH3-64 (seed 0); content hashes are XXH3-128.
"""

from __future__ import annotations

import enum
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

import xxhash

from replayfmt.errors import ReplayFormatError, ReplayUsageError, ReplayVersionError

MAGIC = b"KREPLAY\x00"
FOOTER_MAGIC = b"KRFOOTER"
CHUNK_MAGIC = b"KRCK"
FORMAT_MAJOR = 1
FORMAT_MINOR = 7  # 1.1: State operations, Buffer.ranges (typed sub-ranges); 1.2: Graph objects, GraphLaunch;
# 1.3: data relocations (pointers stored in State and upload bytes), Index.partial, Checkpoint.types (typed
# tensors of checkpointed ranges); 1.4: Buffer.module_global (a module global's storage); 1.5: Collective
# operations (one rank's NCCL calls); 1.6: State.flags (STATE_FLAG_UNDEFINED: a range that held none of the
# program's data when its region began); 1.7: Graph.edge_data (how each edge orders its nodes: programmatic
# dependent launch) and LaunchRecord.flags bit 2 (LAUNCH_FLAG_PROGRAMMATIC: a launch that allowed it)

ALIGNMENT = 8

_FILE_HEADER = struct.Struct("<8sHHIII8s")  # magic, major, minor, header_size, flags, reserved, checksum
FILE_HEADER_SIZE = _FILE_HEADER.size  # 32
_CHUNK_HEADER = struct.Struct("<4sHHB7sQQ16sQQ")
CHUNK_HEADER_SIZE = _CHUNK_HEADER.size  # 64
_FOOTER = struct.Struct("<8sQQQ")  # magic, index_offset, file_size, checksum
FOOTER_SIZE = _FOOTER.size  # 32

_ZERO7 = bytes(7)
_ZERO16 = bytes(16)


class ChunkKind(enum.IntEnum):
    """What a chunk's body holds. Unknown kinds may be skipped only when flagged OPTIONAL."""

    METADATA = 1  # FlatBuffer CaptureMetadata
    RECORDS = 2  # FlatBuffer RecordBatch
    FRAME = 3  # one frame of payload bytes; key = XXH3-128 of the logical bytes
    INDEX = 4  # FlatBuffer Index, followed by the footer
    TIMINGS = 5  # FlatBuffer Timings: the original program's device times (written OPTIONAL)


KNOWN_CHUNK_KINDS = frozenset(int(k) for k in ChunkKind)


class ChunkFlags(enum.IntFlag):
    NONE = 0
    OPTIONAL = 1  # a reader that does not know this chunk kind may skip it


KNOWN_CHUNK_FLAGS = ChunkFlags.OPTIONAL


class Codec(enum.IntEnum):
    RAW = 0
    ZSTD = 1


def checksum64(data: bytes | memoryview) -> int:
    return xxhash.xxh3_64_intdigest(data)


def align_up(n: int) -> int:
    return (n + ALIGNMENT - 1) & ~(ALIGNMENT - 1)


MAX_BATCH_OPERATIONS = 1 << 17  # what a writer seals into one record batch at most (objects: as many again)


@dataclass(frozen=True, slots=True)
class Limits:
    """Caps that protect readers from hostile files ("for your safety"; docs/FORMAT.md §5.2).

    Every size a file declares is checked against these before memory is allocated or data is
    decompressed, and every decoding step is charged to a budget proportional to the bytes the
    file really holds. Raise them only for files you trust.
    """

    max_metadata_size: int = 16 << 20  # logical bytes of a METADATA chunk body
    max_index_size: int = 1 << 30  # logical bytes of the INDEX chunk body (also <= 2 x the file size)
    max_record_batch_size: int = 256 << 20  # logical bytes of one RECORDS chunk body
    max_frame_size: int = 64 << 20  # logical bytes of one payload frame
    max_payload_size: int = 1 << 40  # logical bytes of one payload
    max_depth: int = 8  # FlatBuffers table nesting (the schema itself needs 4)
    # zstd: a chunk may decompress to at most max_expansion x its stored bytes + expansion_slack
    # (the writer's record batches compress 5-50x; a zstd bomb reaches 30,000x)
    max_expansion: int = 1024
    expansion_slack: int = 16 << 20
    # FlatBuffers decoding, per chunk: values produced (strings, vectors, structs, counted at each
    # reference, so offsets shared many times over are charged every time they are used) may
    # total decode_expansion x the body + 64 KiB; tables, vectors and strings at most one per 4
    # bytes of body and never more than max_decode_objects
    decode_expansion: int = 2
    max_decode_objects: int = 4 << 20
    # one call that returns a whole payload as bytes (read_payload); read larger ones in pieces
    # with read_payload_into
    max_read_size: int = 16 << 30
    # an executable image read whole to plan a replay (captured payload or referenced file)
    max_executable_size: int = 256 << 20
    # counts a 1.2 record declares, checked when the decoder reaches the vector (before its
    # elements are decoded or anything is allocated for them): a graph's nodes and dependency
    # edges, and the TIMINGS chunk's operation and scope rows
    max_graph_nodes: int = 1 << 15
    max_graph_edges: int = 1 << 18
    max_timing_rows: int = 1 << 20
    # and every graph of a capture together (charged as record batches are first decoded)
    max_graph_nodes_total: int = 1 << 16
    max_graph_edges_total: int = 1 << 20
    # walks over CUDA graphs and their child graphs (checks, dumps, per-kernel timing, tuning):
    # child graphs nest at most max_graph_depth deep, and one walk visits at most
    # max_graph_visits nodes in all (a child graph reached again is remembered, not walked again)
    max_graph_depth: int = 16
    max_graph_visits: int = 1 << 21
    # pointers one launch re-points (in its parameters, at most 32 KiB of them, and in buffers
    # it writes): a million relocations in one launch is a forged file's, checked at decode
    max_launch_relocations: int = 1 << 18
    # a payload's frames (1 TiB in 1 MiB frames; the writer's 4 MiB frames make 262k), a
    # checkpoint's entries and its typed tensors, the operations and objects of one record batch
    # (the writer seals one every 8192 operations by default): declared counts, checked before
    # the elements are decoded (a small compressed chunk may declare millions)
    max_payload_frames: int = 1 << 20
    max_checkpoint_entries: int = 1 << 20
    max_batch_records: int = 2 * MAX_BATCH_OPERATIONS

    def vector_caps(self) -> dict[tuple[str, str], tuple[int, str]]:
        """(table, vector field) -> (most elements, the Limits field that sets it): what
        :func:`replayfmt.format.decoder.decode_buffer` checks a declared count against."""
        return {
            ("Graph", "nodes"): (self.max_graph_nodes, "max_graph_nodes"),
            ("Graph", "edges"): (self.max_graph_edges, "max_graph_edges"),
            ("Graph", "edge_data"): (self.max_graph_edges, "max_graph_edges"),
            ("Timings", "operations"): (self.max_timing_rows, "max_timing_rows"),
            ("Timings", "scopes"): (self.max_timing_rows, "max_timing_rows"),
            ("Payload", "frames"): (self.max_payload_frames, "max_payload_frames"),
            ("Checkpoint", "entries"): (self.max_checkpoint_entries, "max_checkpoint_entries"),
            ("Checkpoint", "types"): (self.max_checkpoint_entries, "max_checkpoint_entries"),
        }

    def check_expansion(self, stored: int, logical: int) -> str | None:
        """Why a chunk of ``stored`` bytes may not declare ``logical`` bytes, or None."""
        bound = stored * self.max_expansion + self.expansion_slack
        if logical > bound:
            return (
                f"declares {logical} bytes from {stored} stored, more than max_expansion "
                f"({self.max_expansion}x + {self.expansion_slack}) allows (a decompression bomb?)"
            )
        return None

    def overridden(self, values: Mapping[str, int]) -> Limits:
        """These limits with ``values`` (field name -> a whole number > 0) in place; an unknown
        name or a value that is not a positive whole number is a ReplayUsageError naming it
        (``--limit NAME=VALUE`` in every tool)."""
        names = {f.name for f in fields(self)}
        for name, value in values.items():
            if name not in names:
                raise ReplayUsageError(f"--limit {name}: no such limit (one of: {', '.join(sorted(names))})")
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ReplayUsageError(f"--limit {name}={value!r}: must be a whole number > 0")
        return replace(self, **values)

    def changes(self) -> dict[str, int]:
        """The fields that differ from the defaults (what a worker process is told)."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) != getattr(DEFAULT_LIMITS, f.name)}


_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_limit(spec: str) -> tuple[str, int]:
    """``NAME=VALUE`` (VALUE a whole number, optionally with K, M, G or T: powers of 1024) as a
    (name, value) pair; what :meth:`Limits.raised` takes. A malformed spec is a ReplayUsageError."""
    name, sep, text = spec.partition("=")
    name, text = name.strip(), text.strip().upper().removesuffix("IB").removesuffix("B")
    if not sep or not name or not text:
        raise ReplayUsageError(f"--limit {spec!r}: expected NAME=VALUE, e.g. max_frame_size=256M")
    unit = text[-1] if text[-1] in _SUFFIXES else ""
    try:
        number = float(text[: len(text) - len(unit)])
    except ValueError:
        raise ReplayUsageError(f"--limit {spec!r}: {text!r} is not a number") from None
    value = number * _SUFFIXES[unit]
    if not math.isfinite(value) or value <= 0 or value != int(value):
        raise ReplayUsageError(f"--limit {spec!r}: must be a finite whole number > 0")
    return name, int(value)


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True, slots=True)
class FileHeader:
    major: int
    minor: int
    header_size: int
    flags: int


def pack_file_header(header: FileHeader) -> bytes:
    head = _FILE_HEADER.pack(MAGIC, header.major, header.minor, header.header_size, header.flags, 0, _ZERO16[:8])
    checksum = checksum64(head[:24]).to_bytes(8, "little")
    return head[:24] + checksum


def unpack_file_header(data: bytes, path: str | None = None) -> FileHeader:
    """Check the fixed file header; refuse other files, damaged headers and newer majors."""
    if len(data) < FILE_HEADER_SIZE or data[:8] != MAGIC:
        raise ReplayFormatError("not a .kreplay file (bad magic; expected b'KREPLAY\\x00')", path=path, offset=0)
    _, major, minor, header_size, flags, reserved, checksum = _FILE_HEADER.unpack_from(data)
    if checksum != checksum64(data[:24]).to_bytes(8, "little"):
        raise ReplayFormatError("file header checksum mismatch", path=path, offset=0)
    if major > FORMAT_MAJOR:
        raise ReplayVersionError(
            f"format version {major}.{minor} is newer than this reader's "
            f"{FORMAT_MAJOR}.{FORMAT_MINOR}: upgrade replayfmt to read it",
            path=path,
            offset=8,
        )
    if major < 1:
        raise ReplayFormatError(f"invalid format major version {major}", path=path, offset=8)
    if header_size < FILE_HEADER_SIZE or header_size > 4096:
        raise ReplayFormatError(f"invalid header size {header_size}", path=path, offset=12)
    if major == FORMAT_MAJOR and (flags != 0 or reserved != 0):
        raise ReplayFormatError("reserved header fields must be zero", path=path, offset=16)
    return FileHeader(major, minor, header_size, flags)


@dataclass(frozen=True, slots=True)
class ChunkHeader:
    offset: int  # file offset of this header
    kind: int
    flags: int
    codec: int
    stored_size: int
    logical_size: int
    key: bytes  # 16 bytes; FRAME: XXH3-128 of the logical bytes
    body_checksum: int

    @property
    def body_offset(self) -> int:
        return self.offset + CHUNK_HEADER_SIZE

    @property
    def end(self) -> int:
        """Offset of the next chunk."""
        return align_up(self.body_offset + self.stored_size)


def pack_chunk_header(
    kind: int, flags: int, codec: int, body: bytes | memoryview, logical_size: int, key: bytes = _ZERO16
) -> bytes:
    head = _CHUNK_HEADER.pack(
        CHUNK_MAGIC, kind, flags, codec, _ZERO7, len(body), logical_size, key, checksum64(body), 0
    )
    return head[:56] + checksum64(head[:56]).to_bytes(8, "little")


def unpack_chunk_header(data: bytes | memoryview, offset: int, path: str | None = None) -> ChunkHeader:
    """Check one chunk header (magic, checksum, reserved bytes, codec, flags)."""
    if len(data) < CHUNK_HEADER_SIZE:
        raise ReplayFormatError("truncated chunk header", path=path, offset=offset)
    magic, kind, flags, codec, reserved, stored, logical, key, body_sum, head_sum = _CHUNK_HEADER.unpack_from(data)
    if magic != CHUNK_MAGIC:
        raise ReplayFormatError("bad chunk magic (expected b'KRCK')", path=path, offset=offset)
    if head_sum != checksum64(bytes(data[:56])):
        raise ReplayFormatError("chunk header checksum mismatch", path=path, offset=offset)
    if reserved != _ZERO7:
        raise ReplayFormatError("reserved chunk header bytes must be zero", path=path, offset=offset)
    if flags & ~int(KNOWN_CHUNK_FLAGS):
        raise ReplayFormatError(f"unknown chunk flags {flags:#x}", path=path, offset=offset)
    if codec not in (Codec.RAW, Codec.ZSTD):
        raise ReplayFormatError(f"unknown codec {codec}", path=path, offset=offset)
    if codec == Codec.RAW and stored != logical:
        raise ReplayFormatError(
            f"raw chunk declares {logical} logical bytes but stores {stored}", path=path, offset=offset
        )
    return ChunkHeader(offset, kind, flags, codec, stored, logical, key, body_sum)


def pack_footer(index_offset: int, file_size: int) -> bytes:
    head = _FOOTER.pack(FOOTER_MAGIC, index_offset, file_size, 0)
    return head[:24] + checksum64(head[:24]).to_bytes(8, "little")


def unpack_footer(data: bytes) -> tuple[int, int] | None:
    """Return (index_offset, file_size) of a valid footer, or None when there is none."""
    if len(data) != FOOTER_SIZE:
        return None
    magic, index_offset, file_size, checksum = _FOOTER.unpack(data)
    if magic != FOOTER_MAGIC or checksum != checksum64(data[:24]):
        return None
    return index_offset, file_size
