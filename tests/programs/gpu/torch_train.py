#!/usr/bin/env python3
"""GPU test program: a small deterministic PyTorch training loop on CUDA that prints ptr lines for
its tensors and each step's loss bit-exactly, for check_pool_run.py's native-vs-shim comparison.

Exits 77 (the ctest skip code) when PyTorch or a CUDA device is not available."""
import os
import sys
import time

# cuBLAS reads this when its handle is created: it must be set before the first matmul.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

SKIP = 77

try:
    import torch
except ImportError as exc:  # the lead's GPU machine has it; other machines skip
    print(f"SKIP: PyTorch is not importable: {exc}", file=sys.stderr)
    sys.exit(SKIP)

from torch_reproducible import make_reproducible  # noqa: E402  (beside this file)

if not torch.cuda.is_available():
    print("SKIP: torch.cuda.is_available() is False", file=sys.stderr)
    sys.exit(SKIP)


def print_ptr(tensor, what):
    if tensor is None or not tensor.is_cuda:
        return
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0:
        return
    print(f"ptr 0x{tensor.data_ptr():x} {nbytes} tensor {what}")


def parse_args(argv):
    steps, device, pause_at, gate = 50, 0, None, None
    it = iter(argv)
    for arg in it:
        if arg == "--steps":
            steps = int(next(it))
        elif arg == "--device":
            device = int(next(it))
        elif arg == "--pause-at":  # after that step: print "paused", wait until the file GATE exists
            pause_at, gate = int(next(it)), next(it)
        else:
            print(f"usage: torch_train.py [--steps N] [--device N] [--pause-at STEP GATE] (got {arg!r})",
                  file=sys.stderr)
            sys.exit(2)
    return steps, device, pause_at, gate


def main():
    steps, device_index, pause_at, gate = parse_args(sys.argv[1:])
    make_reproducible()
    device = torch.device("cuda", device_index)
    torch.cuda.set_device(device)
    print(f"info torch {torch.__version__} cuda {torch.version.cuda} "
          f"device {torch.cuda.get_device_name(device)}")

    # Synthetic regression-to-classes data, made on the CPU generator so it is the same bits in
    # every run; 16384 x 1024 fp32 = 64 MiB on the GPU.
    gen = torch.Generator().manual_seed(42)
    n_samples, n_features, n_classes, batch = 16384, 1024, 16, 512
    features = torch.randn(n_samples, n_features, generator=gen)
    teacher = torch.randn(n_features, n_classes, generator=gen)
    labels = (features @ teacher).argmax(dim=1)
    features = features.to(device)
    labels = labels.to(device)
    print_ptr(features, "dataset_features")
    print_ptr(labels, "dataset_labels")

    model = torch.nn.Sequential(
        torch.nn.Linear(n_features, 2048),
        torch.nn.ReLU(),
        torch.nn.Linear(2048, 2048),
        torch.nn.LayerNorm(2048),
        torch.nn.ReLU(),
        torch.nn.Linear(2048, n_classes),
    ).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    order = torch.randperm(n_samples, generator=gen)

    def print_state(tag):
        for name, p in model.named_parameters():
            print_ptr(p, f"{tag}.param.{name}")
            print_ptr(p.grad, f"{tag}.grad.{name}")
            for key, value in optimizer.state.get(p, {}).items():
                if torch.is_tensor(value):
                    print_ptr(value, f"{tag}.optim.{name}.{key}")

    for step in range(steps):
        start = (step * batch) % n_samples
        idx = order[start:start + batch].to(device)
        # index_select makes a new batch tensor every step: allocator traffic on each step.
        x = features.index_select(0, idx)
        y = labels.index_select(0, idx)
        print_ptr(x, f"batch_x.{step}")
        print_ptr(y, f"batch_y.{step}")
        optimizer.zero_grad(set_to_none=False)
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"result loss_{step} {loss.item().hex()}")
        if step == pause_at:
            # A whole-process checkpoint is taken here (tests/gpu/process_check.py): the rest of the run
            # must be bitwise the same after the restore.
            print("paused", flush=True)
            while not os.path.exists(gate):
                time.sleep(0.05)
        if step == 0:
            print_state("step0")

    print_state("final")
    with torch.no_grad():
        # Sums in float64 on the device are deterministic for a fixed shape; print exact bits.
        for name, p in model.named_parameters():
            print(f"result param_sum.{name} {p.double().sum().item().hex()}")
        correct = (model(features).argmax(dim=1) == labels).sum().item()
    print(f"result train_correct {correct}")
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats(device)
    print(f"info allocated_peak {stats.get('allocated_bytes.all.peak', 0)} "
          f"reserved_peak {stats.get('reserved_bytes.all.peak', 0)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
