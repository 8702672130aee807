"""A stand-in for a Hugging Face Trainer script (named as such): its argument parser is as strict as
HfArgumentParser (an unknown option such as `--deepspeed_config` ends it with exit status 2), it takes the
DeepSpeed config through `--deepspeed` (a path, or the base64 text the runner hands over) and its batch size as
`--per_device_train_batch_size`, which must agree with the config unless the config says "auto". Instead of
training it writes the metrics file the DeepSpeed engine would, where the config's autotuning section says."""
import argparse
import base64
import json
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--output_dir", required=True)
parser.add_argument("--deepspeed", required=True)
parser.add_argument("--per_device_train_batch_size", type=int, default=8)
parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
parser.add_argument("--learning_rate", type=float, default=5e-5)
parser.add_argument("--local_rank", type=int, default=-1)  # DeepSpeed's launcher adds it
args = parser.parse_args()

config = json.loads(base64.urlsafe_b64decode(args.deepspeed))
for key, given in (("train_micro_batch_size_per_gpu", args.per_device_train_batch_size),
                   ("gradient_accumulation_steps", args.gradient_accumulation_steps)):
    if config.get(key, "auto") not in ("auto", given):
        sys.exit(f"ValueError: ds_config {key}={config[key]} but the Trainer's argument is {given}")
throughput = args.per_device_train_batch_size * 10 + args.learning_rate * 1000
with open(config["autotuning"]["metric_path"], "w") as f:
    json.dump({"throughput": throughput, "latency": 1.0 / throughput, "FLOPS_per_gpu": 1.0}, f)
