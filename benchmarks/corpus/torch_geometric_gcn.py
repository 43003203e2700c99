"""torch_geometric: a two-layer GCN's training step (Adam, node classification) on a random graph
(scatter-based message passing). Region: scope "step"."""

import torch
import torch.nn.functional as F
from torch_geometric.nn import GCNConv

from replayfmt.capture import scope

torch.manual_seed(0)
nodes, edges, features, classes = 2048, 16384, 64, 8
x = torch.randn(nodes, features, device="cuda")
edge_index = torch.randint(0, nodes, (2, edges), device="cuda")
y = torch.randint(0, classes, (nodes,), device="cuda")


class GCN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = GCNConv(features, 128)
        self.conv2 = GCNConv(128, classes)

    def forward(self, x, edge_index):
        return self.conv2(F.relu(self.conv1(x, edge_index)), edge_index)


model = GCN().cuda()
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)


def step():
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x, edge_index), y)
    loss.backward()
    optimizer.step()
    return loss


step()
torch.cuda.synchronize()
with scope("step"):
    loss = step()
    torch.cuda.synchronize()
print(f"loss {float(loss):.5f}")
