"""A small real DeepSpeed training job: an MLP regressing synthetic data.

It takes `--deepspeed_config` like any DeepSpeed script (a path, or urlsafe base64 as autotune passes it) and
trains for `--steps` optimizer steps. Under autotune, DeepSpeed's engine measures steps and writes
metrics.json itself, then ends the process; the script needs no change for that.
"""
import argparse

import deepspeed
import torch


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps to train")
    parser.add_argument("--hidden", type=int, default=256, help="width of the hidden layers")
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, args.hidden), torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, 1),
    )
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
    micro_batch = engine.train_micro_batch_size_per_gpu()
    device = engine.device
    for _ in range(args.steps * engine.gradient_accumulation_steps()):
        x = torch.randn(micro_batch, 64, device=device)
        y = x.sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
    if engine.global_rank == 0:
        print(f"trained {args.steps} steps, final loss {loss.item():.4f}")
    # Every rank reaches the end before any tears down: a rank that exits while another still holds its gloo
    # connections can make that one abort in its teardown.
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()  # a clean exit for every rank (gloo threads joined)


if __name__ == "__main__":
    main()
