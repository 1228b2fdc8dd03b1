"""The training function the Kubernetes and KFP custom-function tests ship (tests/training/test_custom.py has its own,
with more to report): each rank says who it is, the ranks all-reduce their ranks over gloo, and rank 0's report
carries the sum. ``tag: fail`` makes rank 1 raise after reporting; ``import yaml`` stands for a package the job
installs (entrypoint.packages)."""

TRAIN_PY = '''
import os


def main(tag: str = "x"):
    import torch
    import torch.distributed as dist
    import yaml  # from entrypoint.packages

    import kubetune

    ctx = kubetune.context()
    print(f"hello from rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} {tag}", flush=True)
    dist.init_process_group("gloo")
    t = torch.tensor([float(ctx.rank)])
    dist.all_reduce(t)
    kubetune.report(step=1, loss=0.5, total_steps=1, metrics={"rank_sum": t.item()})
    dist.destroy_process_group()
    if tag == "fail" and ctx.rank == 1:
        raise RuntimeError("rank one gave up")
    return {"tag": tag}
'''
