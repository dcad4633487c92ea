"""What the PyTorch checks run under the shim share: PyTorch with a GPU or exit 77 saying why, the verdict, and the
process's GPU memory as nvidia-smi shows it."""

import os
import subprocess
import sys

try:
    import torch
except ImportError:
    print("SKIP: no PyTorch in this Python")
    sys.exit(77)
if not torch.cuda.is_available():
    print("SKIP: PyTorch sees no GPU")
    sys.exit(77)


def fail(why):
    print(f"FAIL: {why}", flush=True)
    sys.exit(1)


def used_mib():
    """This process's GPU memory as nvidia-smi shows it."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         stdout=subprocess.PIPE, text=True, check=True).stdout
    for line in out.splitlines():
        pid, used = (x.strip() for x in line.split(","))
        if int(pid) == os.getpid():
            return int(used)
    return 0
