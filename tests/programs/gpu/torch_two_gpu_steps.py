#!/usr/bin/env python3
"""GPU test program: a deterministic PyTorch training run of a model split over two GPUs in one process.

The first layers (stage 0) sit on cuda:0, the last (stage 1) on cuda:1; activations go to cuda:1 with
.to("cuda:1") and their gradients come back the same way in backward. `--devices 0,0` puts both stages on one
GPU: a smoke run of the program on a one-GPU machine, which proves nothing about two. Prints `ptr 0x<addr> <bytes> tensor <what>` for its tensors,
`result loss_<step> <float.hex>` per step (the loss is computed on cuda:1), `reserved <bytes>` (what PyTorch
holds on both GPUs) and `ready` after the first step, `result param_sum.<name> ...` at the end, and `done`;
sleeps a little between steps so that a suspend can land in the middle. Used by check_pool_run.py (shim
against native, bitwise) and suspend_check.py (suspended and resumed against uninterrupted, bitwise).

Exits 77 (the ctest skip code) with the reason on stderr without PyTorch or the GPUs it is given.
"""
import argparse
import os
import sys
import time

# cuBLAS reads this when its handle is created: it must be set before the first matmul.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

SKIP = 77

try:
    import torch
except ImportError as exc:
    print(f"SKIP: PyTorch is not importable: {exc}", file=sys.stderr)
    sys.exit(SKIP)

from torch_reproducible import make_reproducible  # noqa: E402  (beside this file)


def print_ptr(tensor, what):
    if tensor is None or not tensor.is_cuda or tensor.numel() == 0:
        return
    print(f"ptr 0x{tensor.data_ptr():x} {tensor.numel() * tensor.element_size()} tensor {what}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    # Long enough that a suspend asked for at step 10 lands before the end, from a cold cuda-ckpt too.
    ap.add_argument("--sleep", type=float, default=0.15)
    ap.add_argument("--devices", default="0,1", help="the GPUs of stage 0 and stage 1")
    args = ap.parse_args()
    indices = [int(i) for i in args.devices.split(",")]
    if len(indices) != 2 or min(indices) < 0:
        ap.error("--devices wants two GPU indices, e.g. 0,1")
    if torch.cuda.device_count() <= max(indices):
        print(f"SKIP: this program needs GPUs {args.devices}, PyTorch sees {torch.cuda.device_count()}",
              file=sys.stderr)
        return SKIP
    make_reproducible()
    first, second = (torch.device("cuda", i) for i in indices)
    print(f"info torch {torch.__version__} cuda {torch.version.cuda} devices {args.devices}: "
          f"{torch.cuda.get_device_name(first)} / {torch.cuda.get_device_name(second)}")

    # Data made on the CPU generator, so that it is the same bits in every run.
    gen = torch.Generator().manual_seed(42)
    n_samples, n_features, n_classes, batch = 8192, 1024, 16, 512
    features = torch.randn(n_samples, n_features, generator=gen)
    labels = (features @ torch.randn(n_features, n_classes, generator=gen)).argmax(dim=1)
    features, labels = features.to(first), labels.to(second)
    print_ptr(features, "stage0.dataset_features")
    print_ptr(labels, "stage1.dataset_labels")

    stage0 = torch.nn.Sequential(torch.nn.Linear(n_features, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048),
                                 torch.nn.LayerNorm(2048)).to(first)
    stage1 = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
                                 torch.nn.Linear(2048, n_classes)).to(second)
    named = [(f"stage0.{n}", p) for n, p in stage0.named_parameters()] + \
            [(f"stage1.{n}", p) for n, p in stage1.named_parameters()]
    optimizer = torch.optim.Adam([p for _, p in named], lr=1e-3)
    # Some bulk on each GPU, so that a suspend frees a visible amount of memory on both.
    ballast = [torch.ones(128 << 20, dtype=torch.uint8, device=d) for d in (first, second)]
    for d, b in zip(("stage0", "stage1"), ballast):
        print_ptr(b, f"{d}.ballast")

    for step in range(args.steps):
        start = (step * batch) % n_samples
        x, y = features[start:start + batch], labels[start:start + batch]
        optimizer.zero_grad(set_to_none=False)
        hidden = stage0(x)
        # The crossing: forward copies GPU 0 -> GPU 1, backward copies the gradient GPU 1 -> GPU 0.
        moved = hidden.to(second)
        loss = torch.nn.functional.cross_entropy(stage1(moved), y) + ballast[1][step].float() * 0
        loss.backward()
        optimizer.step()
        print_ptr(hidden, f"stage0.hidden.{step}")
        print_ptr(moved, f"stage1.hidden.{step}")
        print(f"result loss_{step} {loss.item().hex()}", flush=True)
        if step == 0:
            for name, p in named:
                print_ptr(p, f"param.{name}")
                print_ptr(p.grad, f"grad.{name}")
                for key, value in optimizer.state.get(p, {}).items():
                    if torch.is_tensor(value):
                        print_ptr(value, f"optim.{name}.{key}")
            reserved = sum(torch.cuda.memory_reserved(i) for i in sorted(set(indices)))
            print(f"reserved {reserved}", flush=True)
            print("ready", flush=True)
        time.sleep(args.sleep)

    with torch.no_grad():
        # Sums in float64 on the device are deterministic for a fixed shape; exact bits.
        for name, p in named:
            print(f"result param_sum.{name} {p.double().sum().item().hex()}")
    torch.cuda.synchronize(first)
    torch.cuda.synchronize(second)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
