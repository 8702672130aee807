"""LoRA fine-tuning with the Hugging Face Trainer, as most fine-tuning is done today: a tiny Llama-style causal LM
built in code (no download) whose weights are frozen, low-rank adapters added by `peft` to its attention
projections, synthetic tokens (experiments/hf_trainer.py's), every option from the command line:

    deepspeed hf_lora.py --deepspeed ds_hf.json --per_device_train_batch_size 4 \
        --gradient_accumulation_steps 1 --output_dir out --max_steps 20

Only the adapters train: DeepSpeed's engine keeps gradients and optimizer states for them alone, and its profile
run (`autotuning.model_info.profile`) counts them apart (`trainable_num_params`), so `autotune tune`'s memory
model holds the frozen weights only once. It needs `pip install 'ds-autotune[hf]'` (transformers, accelerate,
peft).
"""
from dataclasses import dataclass, field

import torch
from hf_trainer import ModelArguments, SyntheticTokens
from peft import LoraConfig, get_peft_model
from transformers import HfArgumentParser, LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments


@dataclass
class LoraArguments:
    """The adapters: rank, scale and the layers they are added to."""

    lora_r: int = field(default=4, metadata={"help": "rank of the adapters"})
    lora_alpha: int = field(default=8, metadata={"help": "their scale (alpha / r multiplies their output)"})
    lora_targets: str = field(default="q_proj,v_proj", metadata={"help": "the modules adapted, comma separated"})


def main() -> None:
    parser = HfArgumentParser((ModelArguments, LoraArguments, TrainingArguments))
    model_args, lora_args, training_args = parser.parse_args_into_dataclasses()
    torch.manual_seed(training_args.seed)
    config = LlamaConfig(vocab_size=model_args.vocab_size, hidden_size=model_args.hidden_size,
                         intermediate_size=2 * model_args.hidden_size, num_hidden_layers=model_args.num_layers,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=model_args.seq_len)
    adapters = LoraConfig(r=lora_args.lora_r, lora_alpha=lora_args.lora_alpha, task_type="CAUSAL_LM",
                          target_modules=lora_args.lora_targets.split(","), lora_dropout=0.0)
    model = get_peft_model(LlamaForCausalLM(config), adapters)  # the base weights frozen, the adapters trainable
    trainable, total = model.get_nb_trainable_parameters()
    trainer = Trainer(model=model, args=training_args,
                      train_dataset=SyntheticTokens(model_args, training_args.seed))
    if trainer.is_world_process_zero():
        print(f"parameters: {total} ({trainable} trainable)", flush=True)
    result = trainer.train()
    if trainer.is_world_process_zero():
        print(f"trained {trainer.state.global_step} steps of {training_args.per_device_train_batch_size} samples "
              f"per device, final loss {result.training_loss:.4f}")
    # As in hf_trainer.py: the process group torn down before exit, so no gloo thread aborts the process.
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
