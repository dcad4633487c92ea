#!/usr/bin/env python3
"""A PyTorch training step, timed: run natively and under the shim, it shows what the shim costs a
real training loop (allocations through PyTorch's caching allocator, many kernel launches).

usage: torch_step.py [--warmup 20] [--steps 100] [--layers 6] [--d-model 1024] [--batch 32] [--seq 256]

A small transformer encoder (bf16 autocast, AdamW, next-token loss over a vocabulary of 8192) on
cuda:0; each step is synchronized and timed. Prints one JSON line:
  {"bench":"torch","median_ms":..,"mean_ms":..,"steps":N,"warmup":W,"params":P,"device":".."}
About 10 s on an H100.
"""
import argparse
import json
import statistics
import sys
import time

import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, vocab, d_model, layers, seq):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.position = nn.Parameter(torch.zeros(seq, d_model))
        layer = nn.TransformerEncoderLayer(d_model, nhead=d_model // 64, dim_feedforward=4 * d_model,
                                           batch_first=True, norm_first=True, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens) + self.position))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--bench-name", default="torch", help="the result line's `bench` (torch_expandable: the same "
                   "step with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch_step.py: torch.cuda is not available")

    vocab = 8192
    torch.manual_seed(0)
    device = torch.device("cuda", 0)
    model = Model(vocab, args.d_model, args.layers, args.seq).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, vocab, (args.batch, args.seq + 1), device=device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(inputs)
            loss = nn.functional.cross_entropy(logits.reshape(-1, vocab).float(), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        torch.cuda.synchronize()

    for _ in range(args.warmup):
        step()
    times_ms = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        times_ms.append((time.perf_counter() - t0) * 1e3)
    print(json.dumps({
        "bench": args.bench_name,
        "median_ms": round(statistics.median(times_ms), 4),
        "mean_ms": round(statistics.fmean(times_ms), 4),
        "min_ms": round(min(times_ms), 4),
        "steps": args.steps,
        "warmup": args.warmup,
        "params": sum(p.numel() for p in model.parameters()),
        "device": torch.cuda.get_device_name(device),
    }), flush=True)


if __name__ == "__main__":
    main()
