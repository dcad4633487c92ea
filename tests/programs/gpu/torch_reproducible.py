"""What the deterministic PyTorch test programs set before their first step, so that every run, native or
under the shim, interrupted or not, gives the same bits. Imported by torch_train.py and torch_two_gpu_steps.py
(each sets CUBLAS_WORKSPACE_CONFIG before PyTorch is imported)."""


def make_reproducible(seed=1234):
    import torch

    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
