"""Grouped GEMMs in Triton, as Triton's grouped-GEMM tutorial runs them: the kernel reads tables
of device pointers (one A, B and C matrix per problem) with ``tl.load`` and casts each to a
pointer. On Hopper (sm_90) and later a second kernel builds TMA tensor descriptors on the device
from those pointers, in scratch memory that ``triton.set_allocator`` hands out. The tables live
in device memory: replay must write the replay's addresses into them (format 1.3 data
relocations), and the descriptors are rebuilt by the kernel from the relocated pointers.

    python -m replayfmt.capture -o grouped.kreplay examples/capture/triton_grouped_gemm.py
    python -m replayfmt.capture -o grouped.kreplay --scope grouped examples/capture/triton_grouped_gemm.py
"""

import torch
import triton
import triton.language as tl

from replayfmt.capture import scope

PROGRAMS = 16  # persistent programs; each walks the tiles of every problem


@triton.jit
def grouped_gemm(
    a_table,
    b_table,
    c_table,
    sizes,
    strides,
    groups,
    PROGRAMS: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):
    tile = tl.program_id(0)
    first = 0
    for g in range(groups):
        m = tl.load(sizes + 3 * g)
        n = tl.load(sizes + 3 * g + 1)
        k = tl.load(sizes + 3 * g + 2)
        tiles_n = tl.cdiv(n, BN)
        count = tl.cdiv(m, BM) * tiles_n
        while tile >= first and tile < first + count:
            lda = tl.load(strides + 3 * g)
            ldb = tl.load(strides + 3 * g + 1)
            ldc = tl.load(strides + 3 * g + 2)
            a = tl.load(a_table + g).to(tl.pointer_type(tl.float16))  # a pointer read from device memory
            b = tl.load(b_table + g).to(tl.pointer_type(tl.float16))
            c = tl.load(c_table + g).to(tl.pointer_type(tl.float16))
            rm = ((tile - first) // tiles_n) * BM + tl.arange(0, BM)
            rn = ((tile - first) % tiles_n) * BN + tl.arange(0, BN)
            rk = tl.arange(0, BK)
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            for kk in range(0, tl.cdiv(k, BK)):
                x = tl.load(a + rm[:, None] * lda + (kk * BK + rk)[None, :])
                y = tl.load(b + (kk * BK + rk)[:, None] * ldb + rn[None, :])
                acc += tl.dot(x, y)
            tl.store(c + rm[:, None] * ldc + rn[None, :], acc.to(tl.float16))
            tile += PROGRAMS
        first += count


@triton.jit
def grouped_gemm_tma(
    a_table,
    bt_table,
    c_table,
    sizes,
    strides,
    groups,
    PROGRAMS: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):
    tile = tl.program_id(0)
    first = 0
    for g in range(groups):
        m = tl.load(sizes + 3 * g)
        n = tl.load(sizes + 3 * g + 1)
        k = tl.load(sizes + 3 * g + 2)
        tiles_n = tl.cdiv(n, BN)
        count = tl.cdiv(m, BM) * tiles_n
        if tile >= first and tile < first + count:
            lda = tl.load(strides + 3 * g)
            ldb = tl.load(strides + 3 * g + 1)
            ldc = tl.load(strides + 3 * g + 2)
            a = tl.load(a_table + g).to(tl.pointer_type(tl.float16))
            bt = tl.load(bt_table + g).to(tl.pointer_type(tl.float16))
            c = tl.load(c_table + g).to(tl.pointer_type(tl.float16))
            # tensor descriptors built on the device, in scratch memory from triton.set_allocator
            a_desc = tl.make_tensor_descriptor(a, shape=[m, k], strides=[lda, 1], block_shape=[BM, BK])
            bt_desc = tl.make_tensor_descriptor(bt, shape=[n, k], strides=[ldb, 1], block_shape=[BN, BK])
            c_desc = tl.make_tensor_descriptor(c, shape=[m, n], strides=[ldc, 1], block_shape=[BM, BN])
            while tile >= first and tile < first + count:
                row = ((tile - first) // tiles_n) * BM
                col = ((tile - first) % tiles_n) * BN
                acc = tl.zeros((BM, BN), dtype=tl.float32)
                for kk in range(0, tl.cdiv(k, BK)):
                    x = a_desc.load([row, kk * BK])
                    y = bt_desc.load([col, kk * BK])
                    acc += tl.dot(x, y.T)
                c_desc.store([row, col], acc.to(tl.float16))
                tile += PROGRAMS
        first += count


def pointer_table(tensors):
    """A device table of the tensors' addresses (int64, uploaded from the host)."""
    return torch.tensor([t.data_ptr() for t in tensors], device="cuda")


def int_table(rows):
    """A device table of int32 triples: (M, N, K) or (lda, ldb, ldc) of each problem."""
    return torch.tensor([v for row in rows for v in row], dtype=torch.int32, device="cuda")


torch.manual_seed(0)
shapes = [(256, 128, 64), (128, 256, 128), (64, 64, 256)]  # (M, N, K) of each problem
group_a = [torch.rand((m, k), device="cuda", dtype=torch.float16) for m, n, k in shapes]
group_b = [torch.rand((k, n), device="cuda", dtype=torch.float16) for m, n, k in shapes]
group_c = [torch.empty((m, n), device="cuda", dtype=torch.float16) for m, n, k in shapes]
expected = [a @ b for a, b in zip(group_a, group_b)]
a_ptrs, b_ptrs, c_ptrs = pointer_table(group_a), pointer_table(group_b), pointer_table(group_c)
sizes = int_table(shapes)
strides = int_table([(a.stride(0), b.stride(0), c.stride(0)) for a, b, c in zip(group_a, group_b, group_c)])
tma = torch.cuda.get_device_capability()[0] >= 9 and hasattr(tl, "make_tensor_descriptor")
if tma:
    group_bt = [b.T.contiguous() for b in group_b]  # (N, K): the layout the TMA kernel loads
    group_c_tma = [torch.empty_like(c) for c in group_c]
    bt_ptrs, c_tma_ptrs = pointer_table(group_bt), pointer_table(group_c_tma)
    strides_tma = int_table([(a.stride(0), bt.stride(0), c.stride(0)) for a, bt, c in zip(group_a, group_bt, group_c)])
    # descriptors need global scratch memory: Triton asks this allocator for it at each launch
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, device="cuda", dtype=torch.int8))
with scope("grouped"):
    grouped_gemm[(PROGRAMS,)](a_ptrs, b_ptrs, c_ptrs, sizes, strides, len(shapes), PROGRAMS, 64, 64, 32)
    if tma:
        grouped_gemm_tma[(PROGRAMS,)](
            a_ptrs, bt_ptrs, c_tma_ptrs, sizes, strides_tma, len(shapes), PROGRAMS, 64, 64, 64
        )
    torch.cuda.synchronize()
for i, want in enumerate(expected):
    assert torch.allclose(group_c[i], want, atol=1e-1, rtol=1e-2), f"problem {i}: the pointer-table kernel differs"
    if tma:
        assert torch.allclose(group_c_tma[i], want, atol=1e-1, rtol=1e-2), f"problem {i}: the TMA kernel differs"
print(
    f"grouped GEMM of {len(shapes)} problems through device pointer tables; TMA on the device: {'yes' if tma else 'no'}"
)
