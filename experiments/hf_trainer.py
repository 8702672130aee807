"""A Hugging Face Trainer script as Trainer users write them: a tiny Llama-style causal LM built from a config in
code (no download), synthetic token data, and every training option from the command line (HfArgumentParser
with TrainingArguments), so it runs exactly as a Trainer script runs under DeepSpeed:

    deepspeed hf_trainer.py --deepspeed ds_hf.json --per_device_train_batch_size 4 \
        --gradient_accumulation_steps 1 --output_dir out --max_steps 20

The config (ds_hf.json) says "auto" where the Trainer fills in its own arguments; its `autotuning` section maps
the micro-batch size and gradient accumulation to the script's options (`arg_mappings`), so `autotune tune`
sets them as arguments. Under autotune, DeepSpeed's engine measures the profile steps, writes metrics.json and
ends the run itself; the script needs no change for that.
"""
from dataclasses import dataclass, field

import torch
from transformers import HfArgumentParser, LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments


@dataclass
class ModelArguments:
    """The model and the data: small enough to train on a CPU in seconds."""

    hidden_size: int = field(default=64, metadata={"help": "width of the model"})
    num_layers: int = field(default=4, metadata={"help": "decoder layers"})
    vocab_size: int = field(default=512, metadata={"help": "tokens in the synthetic vocabulary"})
    seq_len: int = field(default=64, metadata={"help": "tokens per sample"})
    num_samples: int = field(default=4096, metadata={"help": "samples in the synthetic dataset"})


class SyntheticTokens(torch.utils.data.Dataset):
    """Token sequences with a pattern worth learning (each token follows from the one before), fixed by a seed."""

    def __init__(self, args: ModelArguments, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, args.vocab_size, (args.num_samples, 1), generator=generator)
        steps = torch.arange(args.seq_len).unsqueeze(0)
        self.tokens = (starts + 7 * steps) % args.vocab_size

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


def tiny_llama(args: ModelArguments) -> LlamaForCausalLM:
    """The model, built from a config in code (nothing downloaded)."""
    return LlamaForCausalLM(LlamaConfig(vocab_size=args.vocab_size, hidden_size=args.hidden_size,
                                        intermediate_size=2 * args.hidden_size, num_hidden_layers=args.num_layers,
                                        num_attention_heads=4, num_key_value_heads=4,
                                        max_position_embeddings=args.seq_len))


def train(trainer: Trainer, training_args: TrainingArguments) -> None:
    """Train, say how it went, and end the run cleanly."""
    result = trainer.train()
    if trainer.is_world_process_zero():
        print(f"trained {trainer.state.global_step} steps of {training_args.per_device_train_batch_size} samples "
              f"per device, final loss {result.training_loss:.4f}")
    # The Trainer leaves DeepSpeed's process group up; torn down here, its gloo threads are joined before the
    # interpreter exits (left to exit, one can abort the process: "terminate called without an active exception").
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def main() -> None:
    model_args, training_args = HfArgumentParser((ModelArguments, TrainingArguments)).parse_args_into_dataclasses()
    torch.manual_seed(training_args.seed)
    trainer = Trainer(model=tiny_llama(model_args), args=training_args,
                      train_dataset=SyntheticTokens(model_args, training_args.seed))
    train(trainer, training_args)


if __name__ == "__main__":
    main()
