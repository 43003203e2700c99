"""PyTorch CUDA graphs: an MLP's forward captured with torch.cuda.graph and replayed twice on new
inputs copied into its static input. Region: scope "step"."""

import torch

from replayfmt.capture import scope

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)).cuda().eval()
static_in = torch.randn(64, 256, device="cuda")
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side), torch.no_grad():
    for _ in range(3):
        model(static_in)
torch.cuda.current_stream().wait_stream(side)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph), torch.no_grad():
    static_out = model(static_in)
inputs = [torch.randn(64, 256, device="cuda") for _ in range(2)]
torch.cuda.synchronize()
with scope("step"):
    outs = []
    for batch in inputs:
        static_in.copy_(batch)
        graph.replay()
        outs.append(static_out.clone())
    torch.cuda.synchronize()
with torch.no_grad():
    assert torch.allclose(outs[1], model(inputs[1]), atol=1e-4)
print(f"mean {float(outs[0].mean()):.5f}")
