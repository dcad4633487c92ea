"""GPU test program: a deterministic PyTorch training run that prints every step's loss bits.

Prints `ready` after the first step, `result loss_<step> <float.hex>` per step, and `done` at the
end; sleeps a little between steps so a suspend can land in the middle. The checker compares the
losses of a suspended-and-resumed run with an uninterrupted one. With --cache-churn, every step also
fills PyTorch's cache (a temporary of 64 to 512 MiB of random bytes, freed) and every fourth step empties
it (torch.cuda.empty_cache): a suspend lands on a cache with freed blocks that still hold data.
"""
import argparse
import os
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--sleep", type=float, default=0.05)
    ap.add_argument("--cache-churn", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 16)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(512, 1024, device="cuda")
    y = torch.randint(0, 16, (512,), device="cuda")
    # Some bulk, so that a suspend frees a visible amount of memory.
    ballast = torch.ones(256 << 20, dtype=torch.uint8, device="cuda")
    for step in range(args.steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y) + ballast[step].float() * 0
        if args.cache_churn:
            scratch = torch.randint(0, 256, ((64 << 20) * (1 + step % 8),), dtype=torch.uint8, device="cuda")
            loss = loss + scratch[:1].float() * 0
            del scratch
            if step % 4 == 3:
                torch.cuda.empty_cache()
        loss.backward()
        opt.step()
        print(f"result loss_{step} {loss.item().hex()}", flush=True)
        if step == 0:
            # What PyTorch holds on the GPU (with expandable segments: VMM memory it maps itself).
            print(f"reserved {torch.cuda.memory_reserved()}", flush=True)
            print("ready", flush=True)
        time.sleep(args.sleep)
    print("done", flush=True)


if __name__ == "__main__":
    main()
