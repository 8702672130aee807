#!/bin/sh
# A stand-in for DeepSpeed's launcher on a fake GPU (named as such): it reads the config the runner hands over
# (--deepspeed_config, base64), "needs" memory that grows with the ZeRO stage and the micro-batch size, and past
# the fake GPU's 100 GiB fails with the runtime's own OOM message; otherwise it writes the metrics DeepSpeed's
# engine would, with a throughput that is a known function. Each run is logged to $OOM_STANDIN_LOG, and takes
# $OOM_STANDIN_SECONDS (default 0). $OOM_STANDIN_LUCKY="STAGE MBS FACTOR": that config's first run measures its
# throughput times FACTOR (a lucky outlier), its later runs the true value. ZeRO knobs (full mode) count as known
# factors, 1 at DeepSpeed's defaults: overlap_comm on is 10% faster than off; reduce_bucket_size 1e9 is 4% faster
# than 5e8, 5e7 5% slower; contiguous_gradients off 3% slower; allgather_bucket_size 5e7 1% slower, and 1e9 needs
# 5 GiB more; the other knobs change nothing. The knobs a config sets follow its line in the log (key=value).
# $OOM_STANDIN_MODEL="PARAMS BYTES_PER_SAMPLE GPU_BYTES": a DeepSpeed-like need instead, on a fake GPU of
# GPU_BYTES: a model of PARAMS parameters in fp16 with Adam (2 + 2 + 12 bytes a parameter, stage 1 partitioning
# the 12 over the GPUs of --include, stage 2 the gradients too, stage 3 everything), plus BYTES_PER_SAMPLE times
# the micro-batch, plus 1.5e9 the runtime keeps. A profile run (autotuning.model_info.profile) writes the model
# info DeepSpeed's engine would to autotuning.model_info_path, and ends (logged as "profile zS mbsM"). A fourth
# figure, TRAINABLE: only that many parameters train (LoRA-like), and only they have gradients and Adam's 12 bytes.
# Offload (zero_optimization.offload_optimizer / offload_param, device cpu): Adam's 12 bytes (stage 1 and up), and the
# parameters' 2 (stage 3), move to the host with 4 bytes of fp32 gradients a trained parameter, each rank its
# partition (to nvme: off the GPU, not in the host's RAM); past $OOM_STANDIN_HOST bytes (default: this machine's RAM) the run is killed as the kernel's OOM killer
# would (exit 137). Offloading the optimizer makes a step 0.6 times as fast, the parameters 0.5 times more.
# $OOM_STANDIN_CONTEXT: what the runtime keeps, instead of 1.5e9.
# $OOM_STANDIN_STEPS="N SECONDS": before it writes the metrics, N steps of SECONDS each, one line a step in its
# progress file ($AUTOTUNE_PROGRESS_PATH: step, time, throughput within 1% of the value it writes). $OOM_STANDIN_HANG:
# a run out of memory prints the runtime's line and then waits, as a rank does whose peers wait on it.
# $OOM_STANDIN_TERM_SECONDS: a SIGTERM ends it only after that many seconds (a rank that saves a checkpoint first).
# Tensor parallelism (tensor_parallel.autotp_size N, AutoTP): each rank holds 5% of the parameters whole and its
# 1/N of the rest, ZeRO partitions over the data-parallel GPUs (world / N), and 30% of the activations stay whole
# (the rest split N ways); each step pays a communication cost, 10% of a step per doubling of N (within a node);
# the throughput is written as DeepSpeed 0.19.8 writes it, counting each sample N times. `--gradient_checkpointing
# true` (a script argument) keeps a quarter of the activations and makes a step 0.75 times as fast. The run's
# line in the log then carries tpN and gc. $OOM_STANDIN_SCALING="WITHIN ACROSS": the throughput is the whole world's
# (the data-parallel GPUs' sum), each doubling of the GPUs of a node keeping WITHIN of it and each doubling of the
# nodes ACROSS, raised to 1 + stage/2 (a higher ZeRO stage communicates more); the world's size leads its log line.
# A run measured until sure (its config's autotuning.tolerance) makes end_profile_step + 1 such steps instead of N, as
# DeepSpeed's engine would, unless the runner ends it first.
# $OOM_STANDIN_STEP_NOISE="SD SEED" (with OOM_STANDIN_STEPS): each step measures the throughput times 1 + a normal
# draw of standard deviation SD (seeded by SEED, the config and its run's count), and the run writes their mean.
# $OOM_STANDIN_NOISY_STEPS="N NOISE": the run also writes N steps at once to $AUTOTUNE_PROGRESS_PATH, each
# measuring the throughput times 1 + NOISE x sin(step).
while [ $# -gt 0 ]; do case "$1" in --deepspeed_config) cfg="$2"; shift;; --include) inc="$2"; shift;;
    --gradient_checkpointing) gc="$2"; shift;; esac; shift; done
exec python3 - "$cfg" "$inc" "${gc:-false}" <<'PY'
import base64, json, math, os, random, signal, sys, time
if os.environ.get("OOM_STANDIN_TERM_SECONDS"):
    def ending(signum, frame):
        time.sleep(float(os.environ["OOM_STANDIN_TERM_SECONDS"]))
        sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, ending)
config = json.loads(base64.urlsafe_b64decode(sys.argv[1]))
tp = (config.get("tensor_parallel") or {}).get("autotp_size") or 1
checkpointed = sys.argv[3] == "true"
zero = config["zero_optimization"]
stage, mbs = zero["stage"], config["train_micro_batch_size_per_gpu"]
world = sum(len(part.split(":", 1)[1].split(",")) if ":" in part else 1 for part in sys.argv[2].split("@")) \
    if sys.argv[2] else 1
profile = (config["autotuning"].get("model_info") or {}).get("profile")
line = " ".join([f"z{stage} mbs{mbs}", *(f"{k}={json.dumps(v)}" for k, v in zero.items() if k != "stage"),
                 *([f"tp{tp}"] if "tensor_parallel" in config else []), *(["gc"] if checkpointed else [])])
if os.environ.get("OOM_STANDIN_SCALING"):
    line = f"w{world} " + line
with open(os.environ["OOM_STANDIN_LOG"], "a") as log:
    log.write(("profile " if profile else "") + line + "\n")
with open(os.environ["OOM_STANDIN_LOG"]) as log:
    first = log.read().splitlines().count(line) == 1
time.sleep(float(os.environ.get("OOM_STANDIN_SECONDS", "0")))
allgather = zero.get("allgather_bucket_size", 500_000_000)
model = os.environ.get("OOM_STANDIN_MODEL", "").split()
if profile and not model:
    sys.exit("stand-in: no OOM_STANDIN_MODEL to write the model info from")
if model:
    params, per_sample, gpu = (float(w) for w in model[:3])
    trained = float(model[3]) if len(model) > 3 else params
    params, trained = (n * 0.05 + n * 0.95 / tp for n in (params, trained))
    per_sample *= (0.3 + 0.7 / tp) * (0.25 if checkpointed else 1.0)
    dp = max(1, world // tp)  # ZeRO's partitions: over the data-parallel GPUs
    weights = 2 * params / dp if stage >= 3 else 2 * params
    grads = 2 * trained / dp if stage >= 2 else 2 * trained
    adam = 12 * trained / dp if stage >= 1 else 12 * trained
    host = 0.0
    device = {key: (zero.get(key) or {}).get("device") for key in ("offload_optimizer", "offload_param")}
    if stage >= 1 and device["offload_optimizer"] in ("cpu", "nvme"):
        host, adam = host + (adam + 4 * trained / dp) * world * (device["offload_optimizer"] == "cpu"), 0.0
    if stage >= 3 and device["offload_param"] in ("cpu", "nvme"):
        host, weights = host + weights * world * (device["offload_param"] == "cpu"), 0.0
    ram = float(os.environ.get("OOM_STANDIN_HOST") or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    if host > ram:
        print(f"stand-in: the offloaded states need {host:.0f} bytes of a node of {ram:.0f}", file=sys.stderr)
        sys.stderr.write("Killed\n")
        os._exit(137)
    context = float(os.environ.get("OOM_STANDIN_CONTEXT", "1.5e9"))
    oom = weights + grads + adam + per_sample * mbs + context > gpu
else:
    oom = {0: 40, 1: 30, 2: 20, 3: 10}[stage] + 2.0 * mbs + (5 if allgather >= 1e9 else 0) > 100
if oom:
    if os.environ.get("OOM_STANDIN_HANG"):
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", file=sys.stderr, flush=True)
        time.sleep(3600)
    sys.exit("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
if profile:
    with open(config["autotuning"]["model_info_path"], "w") as f:
        json.dump({"num_params": int(params), "trainable_num_params": int(trained),
                   "activation_mem_per_gpu": per_sample * mbs}, f)
    sys.exit(0)
throughput = mbs * 100 / (1 + mbs / 64) * (1 - 0.05 * stage)
throughput *= (1.1 if zero.get("overlap_comm", stage == 3) else 1.0) / (1.1 if stage == 3 else 1.0)
throughput *= {5e7: 0.95, 5e8: 1.0, 1e9: 1.04}.get(zero.get("reduce_bucket_size", 5e8), 1.0)
throughput *= 1.0 if zero.get("contiguous_gradients", True) else 0.97
throughput *= 0.99 if allgather == 5e7 else 1.0
throughput *= 0.6 if (zero.get("offload_optimizer") or {}).get("device") == "cpu" and stage >= 1 else 1.0
throughput *= 0.5 if (zero.get("offload_param") or {}).get("device") == "cpu" and stage >= 3 else 1.0
throughput *= (0.75 if checkpointed else 1.0) / (1 + 0.1 * math.log2(tp)) * tp  # DeepSpeed's count under TP
scaling = os.environ.get("OOM_STANDIN_SCALING", "").split()
if scaling:  # the whole world's samples: each data-parallel GPU's, less what each doubling costs (more at higher stages)
    nodes = len(sys.argv[2].split("@")) if sys.argv[2] else 1
    paid = float(scaling[0]) ** math.log2(world / nodes) * float(scaling[1]) ** math.log2(nodes)
    throughput *= max(1, world // tp) * paid ** (1 + 0.5 * stage)
lucky = os.environ.get("OOM_STANDIN_LUCKY", "").split()
if lucky and (int(lucky[0]), int(lucky[1])) == (stage, mbs) and first:
    throughput *= float(lucky[2])
steps = os.environ.get("OOM_STANDIN_STEPS", "").split()
if steps and config["autotuning"].get("tolerance"):  # measured until sure: steps to its window's end, as the engine
    steps[0] = str(config["autotuning"]["end_profile_step"] + 1)  # does; the runner ends it sooner once sure
noise = os.environ.get("OOM_STANDIN_STEP_NOISE", "").split()
if noise:  # each run's own draws: the seed, its config's line and how many times that line ran
    with open(os.environ["OOM_STANDIN_LOG"]) as log:
        draws = random.Random(f"{noise[1]} {line} {log.read().splitlines().count(line)}")
measured = []
for n in range(int(steps[0]) if steps else 0):
    time.sleep(float(steps[1]))
    measured.append(throughput * (1 + (draws.gauss(0, float(noise[0])) if noise else 0.01 * (n % 3 - 1))))
    with open(os.environ["AUTOTUNE_PROGRESS_PATH"], "a") as f:
        f.write(json.dumps({"step": n + 1, "time": time.time(), "throughput": measured[-1]}) + "\n")
if noise and measured:
    throughput = sum(measured) / len(measured)  # what the run measured, not the law's value
noisy = os.environ.get("OOM_STANDIN_NOISY_STEPS", "").split()
if noisy:  # the progress file at once, one line a step, around the throughput
    now = time.time()
    with open(os.environ["AUTOTUNE_PROGRESS_PATH"], "a") as f:
        for i in range(int(noisy[0])):
            f.write(json.dumps({"step": i, "time": now + 0.01 * i,
                                "throughput": throughput * (1 + float(noisy[1]) * math.sin(i))}) + "\n")
with open(config["autotuning"]["metric_path"], "w") as f:
    json.dump({"throughput": throughput, "latency": 1 / throughput, "FLOPS_per_gpu": 1.0}, f)
PY
