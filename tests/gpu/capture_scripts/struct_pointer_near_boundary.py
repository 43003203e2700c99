"""PyTorch tensors just below and just past a 4 GiB boundary high in the address space, updated by
a foreach kernel, which takes their addresses in a struct by value (TensorListMetadata). The
caching allocator puts segments there by chance (a BERT and a MobileNet step failed a few
captures in ten); here an allocation across one is made on purpose, so that the words are
certain: the one below reads as a small negative
integer in its low half. Beside them in the same lists is a tensor whose address no integer pair
makes, as in an optimizer's lists. A replay in another process must relocate all three, or it
writes through the capture's addresses and faults. Prints "allocated at 0x..." and the program's own check.

    python -m replayfmt.capture -o OUT.kreplay --scope step struct_pointer_near_boundary.py
"""

import sys

import torch
from address_search import GIB4, SIZE, allocation_where

from replayfmt.capture import scope


def across_a_boundary(base: int) -> int | None:
    """An allocation's start, when the allocation spans a 4 GiB boundary (and starts on none)."""
    return base if base // GIB4 != (base + SIZE - 1) // GIB4 and base % GIB4 else None


class Span:
    """Mapped device memory as __cuda_array_interface__, so torch wraps it without a copy."""

    def __init__(self, address: int, count: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (count,),
            "typestr": "<f4",
            "data": (address, False),
            "version": 3,
            "strides": None,
        }


torch.empty(1, device="cuda")  # the context, and PyTorch's first segment
base = allocation_where(across_a_boundary, "across a 4 GiB boundary")
boundary = (base // GIB4 + 1) * GIB4
below = torch.as_tensor(Span(boundary - 4096, 512), device="cuda")  # low half: -4096
past = torch.as_tensor(Span(boundary + 512, 512), device="cuda")  # low half: 512
middle = torch.as_tensor(Span(base + 8192, 512), device="cuda")  # an address no integer pair makes
assert below.data_ptr() == boundary - 4096 and past.data_ptr() == boundary + 512
below.copy_(torch.arange(512, dtype=torch.float32, device="cuda") / 8)
past.copy_(torch.arange(512, dtype=torch.float32, device="cuda") / 4 + 1)
middle.fill_(2.0)
torch.cuda.synchronize()
print(f"allocated at {base:#x}, boundary {boundary:#x}")
with scope(sys.argv[1] if len(sys.argv) > 1 else "step"):
    torch._foreach_mul_([below, middle, past], 3.0)
    torch._foreach_add_([below, past, middle], 1.0)
    torch.cuda.synchronize()
x, y = torch.arange(512, dtype=torch.float32, device="cuda") / 8 * 3, (torch.arange(512, device="cuda") / 4 + 1) * 3
expected = torch.equal(below, x + 1) and torch.equal(past, y + 1) and bool((middle == 7).all())
assert expected, "the program itself went wrong"
print(f"sum {float(below.sum() + past.sum() + middle.sum()):.1f}")
