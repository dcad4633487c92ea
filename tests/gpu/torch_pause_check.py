"""The Python API's pause and resume in PyTorch on a GPU (gpu.python_pause_torch).

Run under the shim (cuda-ckpt run -- python torch_pause_check.py). A model runs; vmmckpt.pause() gives its
memory back and nvidia-smi shows the process's memory drop by at least the model's size; vmmckpt.resume()
brings it back and the outputs are bitwise equal. Then the same with keep=False (the bytes dropped): the
weights and the input read as zeros after resume, and reloading them from CPU copies gives the same outputs again (the
torch_memory_saver use). Exit 77 with the reason where PyTorch or a GPU is missing.
"""

import time

from torch_under_shim import fail, torch, used_mib

import vmmckpt  # noqa: E402


if not vmmckpt.under_shim():
    fail("not under the shim: run with cuda-ckpt run")
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(16)]).cuda()  # 1 GiB of weights
x = torch.randn(256, 4096, device="cuda")
with torch.no_grad():
    before = model(x).cpu()
torch.cuda.synchronize()
model_mib = sum(p.numel() * p.element_size() for p in model.parameters()) >> 20
weights_cpu = {k: v.cpu() for k, v in model.state_dict().items()}
x_cpu = x.cpu()

for keep in (True, False):
    used_before = used_mib()
    stats = vmmckpt.pause(keep=keep)
    if vmmckpt.state() != "paused":
        fail(f"state {vmmckpt.state()} after pause")
    time.sleep(0.5)
    used_paused = used_mib()
    back = vmmckpt.resume()
    used_after = used_mib()
    print(f"keep={keep}: nvidia-smi {used_before} MiB -> {used_paused} MiB paused -> {used_after} MiB; "
          f"{stats.bytes_released >> 20} MiB released, {stats.bytes_copied >> 20} MiB kept in {stats.seconds:.3f} s; "
          f"resume {back.seconds:.3f} s", flush=True)
    if used_before - used_paused < model_mib:
        fail(f"nvidia-smi shows {used_before - used_paused} MiB freed, the model has {model_mib} MiB")
    if used_after < used_before - 64:
        fail(f"nvidia-smi shows {used_after} MiB after resume, {used_before} MiB before")
    with torch.no_grad():
        if not keep:
            if any(p.abs().sum().item() != 0 for p in model.parameters()):
                fail("keep=False: the weights are not zeros after resume")
            if x.abs().sum().item() != 0:
                fail("keep=False: the input is not zeros after resume")
            model.load_state_dict(weights_cpu)
            x.copy_(x_cpu)
        after = model(x).cpu()
    if not torch.equal(before, after):
        fail(f"keep={keep}: outputs differ after resume (max diff {(before - after).abs().max().item()})")
print("ok: paused twice, nvidia-smi showed the memory free, outputs bitwise equal after each resume")
