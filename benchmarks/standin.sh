#!/bin/sh
# Stand-in for DeepSpeed's launcher in benchmarks: ignores its arguments, "trains" for $STANDIN_SECONDS,
# then writes a metrics file where the runner asked for one. Starts in about a millisecond.
sleep "${STANDIN_SECONDS:-0.2}"
printf '{"throughput": %s, "latency": 1.0}\n' "${STANDIN_THROUGHPUT:-1.0}" > "$AUTOTUNE_METRICS_PATH"
