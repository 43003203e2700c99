"""A small mixture-of-experts step through PyTorch: routing with topk, the tokens of each expert
gathered by indexing (index_select, nonzero), sorted and counted (cub), combined with index_add_
and broadcasting (TensorIterator kernels, whose parameters hold structs of pointers). Run twice,
it is one unchanged program: diff-replay must call its two captures the same."""

import torch

torch.manual_seed(0)
tokens, hidden, experts = 512, 256, 8
x = torch.randn(tokens, hidden, device="cuda")
gate = torch.randn(hidden, experts, device="cuda")
weights = torch.randn(experts, hidden, hidden, device="cuda") / hidden**0.5
scores = torch.softmax(x @ gate, dim=-1)
top, which = scores.topk(2, dim=-1)
order = torch.argsort(which.flatten())  # cub radix sort
counts = torch.bincount(which.flatten(), minlength=experts)
out = torch.zeros_like(x)
for e in range(experts):
    rows = (which == e).any(dim=-1).nonzero().squeeze(1)  # cub select
    picked = x.index_select(0, rows)
    w = (top * (which == e)).sum(-1).index_select(0, rows).unsqueeze(1)
    out.index_add_(0, rows, (picked @ weights[e]) * w)
y = out + x[order[:tokens] % tokens]  # advanced indexing
torch.cuda.synchronize()
print("sum", float(y.sum()), int(counts.sum()))
