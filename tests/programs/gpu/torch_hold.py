"""GPU test program: trains a small model, then holds its tensors while it is dumped.

Prints one line per tensor: `tensor <name> 0x<data_ptr> <nbytes> <sha256 of its bytes>`, then
`ready`, then waits until its stdin closes or --seconds pass. The checker finds each tensor's bytes
in the image at its data_ptr.
"""
import argparse
import hashlib
import sys
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(256, 512, device="cuda")
    y = torch.randint(0, 10, (256,), device="cuda")
    for _ in range(args.steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    tensors = {"x": x, "y": y}
    for name, p in model.named_parameters():
        tensors[name] = p.data
        tensors[name + ".grad"] = p.grad
        for key, value in opt.state[p].items():
            if torch.is_tensor(value) and value.is_cuda:
                tensors[f"{name}.{key}"] = value
    for name, t in tensors.items():
        data = t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes()
        print(f"tensor {name} 0x{t.data_ptr():x} {t.numel() * t.element_size()} {hashlib.sha256(data).hexdigest()}")
    print("ready", flush=True)
    deadline = time.time() + args.seconds
    while time.time() < deadline:
        time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main())
