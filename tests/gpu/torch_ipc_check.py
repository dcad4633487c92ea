"""PyTorch shares a CUDA tensor between processes under the shim (gpu.torch_ipc).

Run under the shim (cuda-ckpt run -- python torch_ipc_check.py). The producer makes a tensor in the pool and
hands it to a consumer through torch.multiprocessing, which sends its legacy CUDA IPC handle (cudaIpcGetMemHandle,
docs/ipc.md). The consumer checks the sum, adds one to every element, and the producer sees the change: both map
the same memory. Every wait has a deadline, so a hang fails the check. Exit 77 where PyTorch or a GPU is missing.
"""

import sys

try:
    import torch
    import torch.multiprocessing as mp
except ImportError:
    print("SKIP: no PyTorch in this Python")
    sys.exit(77)
if not torch.cuda.is_available():
    print("SKIP: PyTorch sees no GPU")
    sys.exit(77)

POOL = (0x200000000000, 0x280000000000)  # the shim's pools (docs/pool.md)
N = 1 << 22
TIMEOUT_S = 120


def consumer(inbox, outbox):
    t = inbox.get(timeout=TIMEOUT_S)
    total = t.sum().item()
    t.add_(1)
    torch.cuda.synchronize()
    outbox.put((total, t.data_ptr()))
    inbox.get(timeout=TIMEOUT_S)  # keep the tensor until the producer has looked


def main():
    mp.set_start_method("spawn")
    x = torch.arange(N, device="cuda", dtype=torch.float64)
    if not POOL[0] <= x.data_ptr() < POOL[1]:
        print(f"FAIL: the tensor at {x.data_ptr():#x} is not in the shim's pool")
        return 1
    inbox, outbox = mp.Queue(), mp.Queue()
    child = mp.Process(target=consumer, args=(inbox, outbox))
    child.start()
    inbox.put(x)
    total, ptr = outbox.get(timeout=TIMEOUT_S)
    expected = N * (N - 1) / 2
    print(f"consumer: sum {total:.0f} (expected {expected:.0f}), mapped at {ptr:#x}")
    seen = x.sum().item()
    print(f"producer: sum after the consumer's add {seen:.0f} (expected {expected + N:.0f})")
    inbox.put(None)
    child.join(TIMEOUT_S)
    if child.exitcode != 0:
        print(f"FAIL: the consumer exited with {child.exitcode}")
        return 1
    if total != expected or seen != expected + N:
        print("FAIL: the sums differ")
        return 1
    print("PASS: a CUDA tensor shared through torch.multiprocessing, both ways")
    return 0


if __name__ == "__main__":
    sys.exit(main())
