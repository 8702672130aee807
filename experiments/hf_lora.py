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
from hf_trainer import ModelArguments, SyntheticTokens, tiny_llama, train
from peft import LoraConfig, get_peft_model
from transformers import HfArgumentParser, Trainer, TrainingArguments


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
    adapters = LoraConfig(r=lora_args.lora_r, lora_alpha=lora_args.lora_alpha, task_type="CAUSAL_LM",
                          target_modules=lora_args.lora_targets.split(","), lora_dropout=0.0)
    model = get_peft_model(tiny_llama(model_args), adapters)  # the base weights frozen, the adapters trainable
    trainable, total = model.get_nb_trainable_parameters()
    trainer = Trainer(model=model, args=training_args,
                      train_dataset=SyntheticTokens(model_args, training_args.seed))
    if trainer.is_world_process_zero():
        print(f"parameters: {total} ({trainable} trainable)", flush=True)
    train(trainer, training_args)


if __name__ == "__main__":
    main()
