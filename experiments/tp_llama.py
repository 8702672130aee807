"""A small real DeepSpeed job for tensor parallelism: a Llama built in code (transformers' LlamaConfig: 2 layers,
hidden 64, 4 attention and 4 key-value heads, a vocabulary of 256; nothing downloaded) trained on synthetic tokens.

AutoTP shards it when the config says so (`"tensor_parallel": {"autotp_size": 2}`), and it trains on CPU ranks:

    DS_ACCELERATOR=cpu deepspeed --num_gpus 2 tp_llama.py --deepspeed_config ds_tp.json

Every rank draws the same batch at each step (AutoTP asks that the ranks of a TP group see the same inputs; the
data-parallel ranks seeing it too changes nothing measured). `--gradient_checkpointing true` recomputes each
layer's activations in the backward pass (Hugging Face's), the script knob `autotune tune` can search. Under
autotune, DeepSpeed's engine measures the profile steps, writes metrics.json and ends the run itself.
"""
import argparse

import deepspeed
import torch
from transformers import LlamaConfig, LlamaForCausalLM


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps to train")
    parser.add_argument("--seq_len", type=int, default=32, help="tokens per sample")
    parser.add_argument("--gradient_checkpointing", default="false", choices=("true", "false"),
                        help="recompute activations in the backward pass")
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=4,
                                         max_position_embeddings=args.seq_len))
    if args.gradient_checkpointing == "true":
        model.gradient_checkpointing_enable()
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
    held = sum(p.numel() for p in engine.module.parameters())  # AutoTP's shard of the model on this rank
    print(f"rank {engine.global_rank} holds {held} parameters", flush=True)
    micro_batch = engine.train_micro_batch_size_per_gpu()
    data = torch.Generator().manual_seed(1)
    for _ in range(args.steps * engine.gradient_accumulation_steps()):
        tokens = torch.randint(0, 256, (micro_batch, args.seq_len), generator=data).to(engine.device)
        loss = engine(input_ids=tokens, labels=tokens).loss
        engine.backward(loss)
        engine.step()
    if engine.global_rank == 0:
        print(f"trained {args.steps} steps, final loss {loss.item():.4f}")
    torch.distributed.barrier()  # every rank reaches the end before any tears down its gloo connections
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
