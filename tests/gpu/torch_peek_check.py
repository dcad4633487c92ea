"""cuda-ckpt peek and poke on a PyTorch program on a GPU (gpu.torch_peek, gpu.torch_peek_expandable).

Run under the shim (cuda-ckpt run -- python torch_peek_check.py); the program looks at itself from outside through
the real cuda-ckpt. It trains an MLP and names a weight (vmmckpt.name), then checks that:
- peek --ordered by name reads exactly the weight's bytes (param.cpu()), by copy and by map;
- peek --live and --quiesce, run while training goes on, succeed and read the weight's size;
- poke writes one NaN into the weight, the model sees it, and peek -t f32 --stats counts one NaN;
- an address outside the program's memory exits 1 naming it.
Exit 77 with the reason where PyTorch or a GPU is missing.
"""

import json
import os
import subprocess
import sys
import tempfile

from torch_under_shim import fail, torch

import vmmckpt  # noqa: E402


def cuda_ckpt(*args):
    tool = os.environ.get("VMMCKPT_CUDA_CKPT", "cuda-ckpt")
    return subprocess.run([tool, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def train(model, steps):
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(steps):
        x = torch.randn(512, 2048, device="cuda")
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


if not vmmckpt.under_shim():
    fail("not under the shim: run with cuda-ckpt run")
me = os.getpid()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(2048, 8192), torch.nn.ReLU(), torch.nn.Linear(8192, 2048)).cuda()
weight = model[0].weight  # 64 MiB of f32
train(model, 20)
torch.cuda.synchronize()
vmmckpt.name(weight, "layer0.weight")
size = weight.numel() * weight.element_size()
expected = weight.detach().cpu().numpy().tobytes()

for via in ("copy", "map"):
    got = vmmckpt.peek(me, "layer0.weight", order="ordered", via=via)
    if got != expected:
        fail(f"peek --via {via} read {len(got)} bytes, not the weight's {size}, or other bytes")
print(f"peek by name, copy and map: {size} bytes equal to param.cpu()", flush=True)

# While the model trains, readers outside read it unordered and at the dump's gate.
with tempfile.TemporaryDirectory() as scratch:
    readers = [subprocess.Popen([os.environ.get("VMMCKPT_CUDA_CKPT", "cuda-ckpt"), "peek", str(me), "layer0.weight",
                                 "-o", os.path.join(scratch, order), "--" + order],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for order in ("live", "quiesce")]
    train(model, 200)
    for order, reader in zip(("live", "quiesce"), readers):
        out, err = reader.communicate(timeout=120)
        if reader.returncode != 0:
            fail(f"peek --{order} while training exited {reader.returncode}: {err}")
        if os.path.getsize(os.path.join(scratch, order)) != size:
            fail(f"peek --{order} while training wrote {os.path.getsize(os.path.join(scratch, order))} bytes")
print("peek --live and --quiesce while training: ok", flush=True)

torch.cuda.synchronize()
nan = torch.tensor([float("nan")], dtype=torch.float32).numpy().tobytes()
if vmmckpt.poke(me, "layer0.weight+4096", nan) != 4:
    fail("poke did not say it wrote 4 bytes")
seen = int(torch.isnan(weight).sum())
if seen != 1:
    fail(f"the model sees {seen} NaNs in the weight after one poke")
r = cuda_ckpt("peek", str(me), "layer0.weight", "-t", "f32", "--stats", "--json")
if r.returncode != 0:
    fail(f"peek --stats exited {r.returncode}: {r.stderr}")
stats = json.loads(r.stdout)
if stats.get("stats", stats).get("nan") != 1:
    fail(f"peek --stats: {r.stdout}")
print("poke of one NaN seen by the model and by peek --stats", flush=True)

r = cuda_ckpt("peek", str(me), "0x1234", "16")
if r.returncode != 1 or "0x1234" not in r.stderr:
    fail(f"peek of 0x1234 exited {r.returncode}: {r.stderr}")
print("torch peek ok", flush=True)
