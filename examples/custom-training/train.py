"""A custom training function for kubetune (docs/custom-training.md): linear regression with DDP on every process.

kubetune runs ``main`` under torchrun on each process of the job (``resources``), on the laptop, on Kubernetes
or in a KFP task, with ``entrypoint.args`` as keyword arguments. It reports progress with ``kubetune.report`` and
checkpoints with ``kubetune.report_checkpoint``; a rerun of the job after a failure resumes from the newest one.
"""

import os


def main(steps: int = 20, lr: float = 0.05, checkpoint_every: int = 10, seed: int = 0):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import kubetune

    ctx = kubetune.context()
    print(f"rank {os.environ.get('RANK', '0')} of {os.environ.get('WORLD_SIZE', '1')} starting", flush=True)
    distributed = ctx.world_size > 1
    if distributed:
        dist.init_process_group("gloo")  # "nccl" on GPUs

    torch.manual_seed(seed)
    true_w = torch.tensor([[2.0], [-3.0]])
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    start = 0
    if ctx.resume_from is not None:  # a rerun continues where the newest reported checkpoint left off
        state = torch.load(ctx.resume_from, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["step"]
    ddp = DDP(model) if distributed else model

    g = torch.Generator().manual_seed(seed + 1 + ctx.rank)  # each rank sees its own shard of the data
    for step in range(start + 1, steps + 1):
        x = torch.randn(32, 2, generator=g)
        y = x @ true_w + 0.5
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()  # DDP averages the gradients over the ranks
        opt.step()
        kubetune.report(step=step, loss=loss.item(), total_steps=steps, metrics={"weight_error": (model.weight.detach().T - true_w).norm().item()})
        if step % checkpoint_every == 0 or step == steps:
            if ctx.is_main:
                path = ctx.checkpoint_dir / f"step-{step}.pt"
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, path)
                kubetune.report_checkpoint(path, step=step)
            if distributed:
                dist.barrier()  # every rank goes on once the checkpoint is complete

    if distributed:
        dist.destroy_process_group()
    return {"weight": model.weight.detach().flatten().tolist(), "bias": model.bias.item()}
