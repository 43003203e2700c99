"""A torch.compile'd torchvision ResNet-18 (random weights) inference step, the step marked as
a scope. Run alone, it prints the step's device time in the original program (CUDA events).

python -m replayfmt.capture -o resnet.kreplay --scope step examples/capture/resnet_step.py
run-replay --verify --tolerance resnet.kreplay
benchmark-replay --scope step resnet.kreplay
"""

import torch
import torchvision

import replayfmt.capture

torch.manual_seed(0)
model = torchvision.models.resnet18().cuda().eval()
step = torch.compile(model)
x = torch.randn(32, 3, 224, 224, device="cuda")
with torch.no_grad():
    for _ in range(3):
        step(x)  # compile and warm up
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(20):
        start.record()
        step(x)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    print(f"original step: median {sorted(times)[len(times) // 2]:.3f} ms device time over {len(times)} steps")
    with replayfmt.capture.scope("step"):
        y = step(x)
torch.cuda.synchronize()
print("logits", float(y.float().abs().sum()))
