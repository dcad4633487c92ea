"""Tags for serving on a GPU (gpu.torch_tags): a PyTorch serving loop whose weights are made in
vmmckpt.region("weights") and whose KV cache in region("kv_cache"), slept as vLLM sleeps.

Run under the shim (cuda-ckpt run -- python torch_tags_check.py). It serves a few steps (each writes the KV
cache), then sleep(1): nvidia-smi shows the process's memory down by at least the weights and the cache; after
resume the weights are bitwise what they were, the KV cache reads as zeros, and the outputs are bitwise the
same. Then sleep(2): the weights read as zeros after resume, are loaded again from CPU copies, and the outputs
are again the same. Exit 77 with the reason where PyTorch or a GPU is missing.
"""

import sys

from torch_under_shim import fail, torch, used_mib

if not hasattr(torch.cuda, "MemPool"):
    print("SKIP: this PyTorch has no torch.cuda.MemPool")
    sys.exit(77)

import vmmckpt  # noqa: E402

if not vmmckpt.under_shim():
    fail("not under the shim: run with cuda-ckpt run")
torch.manual_seed(0)
torch.zeros(1, device="cuda")  # the context first, outside any region
with vmmckpt.region("weights"):
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).cuda()  # 512 MiB
with vmmckpt.region("kv_cache"):
    kv_cache = torch.zeros(64, 1024, 4096, device="cuda")  # 1 GiB
x = torch.randn(64, 4096, device="cuda")


def serve(steps):
    with torch.no_grad():
        for step in range(steps):
            out = model(x)
            kv_cache[:, step % 1024] = out
    torch.cuda.synchronize()
    return out.cpu()


before = serve(8)
weights_cpu = {k: v.cpu() for k, v in model.state_dict().items()}
tagged_mib = (sum(p.numel() * p.element_size() for p in model.parameters()) + kv_cache.numel() * 4) >> 20

used_before = used_mib()
vmmckpt.sleep(1)
used_asleep = used_mib()
vmmckpt.resume()
print(f"level 1: {used_before} MiB -> {used_asleep} MiB asleep ({tagged_mib} MiB tagged)", flush=True)
if used_before - used_asleep < tagged_mib:
    fail(f"sleep(1) gave back {used_before - used_asleep} MiB, less than the {tagged_mib} MiB tagged")
for k, v in model.state_dict().items():
    if not torch.equal(v.cpu(), weights_cpu[k]):
        fail(f"weight {k} changed in a level-1 sleep")
if int(torch.count_nonzero(kv_cache)) != 0:
    fail("the KV cache kept bytes in a level-1 sleep")
if not torch.equal(serve(8), before):
    fail("outputs differ after a level-1 sleep")

vmmckpt.sleep(2)
vmmckpt.resume()
if any(int(torch.count_nonzero(p)) != 0 for p in model.parameters()):
    fail("the weights kept bytes in a level-2 sleep")
with torch.no_grad():
    for k, v in model.state_dict().items():
        v.copy_(weights_cpu[k])
if not torch.equal(serve(8), before):
    fail("outputs differ after a level-2 sleep and a reload")
print("torch tags ok", flush=True)
