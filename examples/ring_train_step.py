"""One training step of a tiny language model whose attention runs as ring attention (context parallelism).

The model: token embedding -> one causal self-attention layer (q/k/v and output projections, with
cuflash.distributed.ring_flash_attn_func) -> a linear head over the vocabulary. The tokens of each
sequence are sharded over the ranks in the zigzag layout (rank r holds chunks r and 2W-1-r of 2W), the
loss is the mean next-token cross-entropy over the whole sequence, and the parameters, replicated on
every rank, get their gradients summed over the ranks (all_reduce) before the optimizer step.

The script then runs the same step in one process over the unsharded sequence (cuflash.attention) and
checks that loss and gradients agree.

    torchrun --nproc_per_node 2 examples/ring_train_step.py      # GPUs, NCCL, cuflash backend "cuda"
    python examples/ring_train_step.py --cpu [--world-size 2]      # CPU, gloo, 2 spawned processes
"""

import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import cuflash
from cuflash.distributed import ring_flash_attn_func, shard_sequence


class TinyModel(torch.nn.Module):
    def __init__(self, vocab, dim, heads, kv_heads):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.embed = torch.nn.Embedding(vocab, dim)
        self.qkv = torch.nn.Linear(dim, (heads + 2 * kv_heads) * self.head_dim, bias=False)
        self.proj = torch.nn.Linear(dim, dim, bias=False)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, tokens, attention):
        x = self.embed(tokens)  # [B, S, dim]
        batch, seqlen, _ = x.shape
        qkv = self.qkv(x).view(batch, seqlen, self.heads + 2 * self.kv_heads, self.head_dim)
        q, k, v = qkv.split([self.heads, self.kv_heads, self.kv_heads], dim=2)
        x = x + self.proj(attention(q, k, v).reshape(batch, seqlen, -1))
        return self.head(x)


def make_model(device):
    torch.manual_seed(0)  # the same initial parameters on every rank and in the reference
    return TinyModel(vocab=64, dim=64, heads=4, kv_heads=2).to(device)


def make_batch(device, batch=2, seqlen=96):
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 64, (batch, seqlen + 1), generator=gen)
    return tokens[:, :-1].to(device), tokens[:, 1:].to(device)  # inputs, next-token labels


def train_step(model, tokens, labels, attention, total_tokens, lr=0.1):
    """Loss (this rank's share of the mean over all tokens), backward, and the gradients before the step."""
    logits = model(tokens, attention)
    loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum") / total_tokens
    loss.backward()
    return loss


def relative_error(got, want):
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def run(rank, world, device, backend):
    tokens, labels = make_batch(device)
    total = labels.numel()

    # The ring step: every rank its zigzag shard of the tokens and labels; parameters replicated.
    model = make_model(device)
    local_tokens = shard_sequence(tokens, world, rank, "zigzag", dim=1)
    local_labels = shard_sequence(labels, world, rank, "zigzag", dim=1)

    def ring_attention(q, k, v):
        return ring_flash_attn_func(q, k, v, causal=True, layout="zigzag", backend=backend)

    loss = train_step(model, local_tokens, local_labels, ring_attention, total)
    dist.all_reduce(loss)
    for p in model.parameters():
        dist.all_reduce(p.grad)
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad

    # The same step in one process over the whole sequence.
    reference = make_model(device)

    def whole_attention(q, k, v):
        return cuflash.attention(q, k, v, causal=True, backend=backend)

    ref_loss = train_step(reference, tokens, labels, whole_attention, total)
    worst = max(relative_error(grads[name], p.grad) for name, p in reference.named_parameters())
    loss_error = abs(loss.item() - ref_loss.item()) / abs(ref_loss.item())
    # float32 throughout: the ring differs from the one call by float32 rounding (its partial states merge in
    # float32); the GPU's float32 kernels sum in another order than the CPU's, hence the wider bound there.
    tolerance = 1e-5 if device.type == "cpu" else 1e-4
    if rank == 0:
        print(f"ring over {world} rank(s) ({device.type}, cuflash backend {backend}): loss {loss.item():.6f}, "
              f"single process {ref_loss.item():.6f}; largest relative gradient difference {worst:.2e}")
    if worst > tolerance or loss_error > tolerance:
        raise SystemExit(f"rank {rank}: the ring step differs from the single-process step (gradients {worst:.2e}, "
                         f"loss {loss_error:.2e}, tolerance {tolerance:.0e})")
    if rank == 0:
        print("gradients match the single-process step")


def _cpu_worker(rank, world, port):
    os.environ.setdefault("CUFLASH_NUM_THREADS", "1")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        run(rank, world, torch.device("cpu"), "cpu")
    finally:
        dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="spawn gloo processes on the CPU instead of torchrun")
    parser.add_argument("--world-size", type=int, default=2, help="processes with --cpu (default 2)")
    args = parser.parse_args()
    if args.cpu:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(_cpu_worker, args=(args.world_size, port), nprocs=args.world_size)
        return
    if "RANK" not in os.environ:
        raise SystemExit("run under torchrun (torchrun --nproc_per_node N examples/ring_train_step.py), or pass --cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", device_id=device)
    try:
        run(dist.get_rank(), dist.get_world_size(), device, "cuda")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
