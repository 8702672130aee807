#!/bin/sh
# Stand-in for DeepSpeed's launcher in benchmarks and tests: ignores its arguments, writes a metrics file where
# the runner asked for one, then "trains" for $STANDIN_SECONDS. It execs sleep rather than forking it, so that
# the stand-in's own cost stays about a millisecond and what is measured is the runner.
printf '{"throughput": %s, "latency": 1.0}\n' "${STANDIN_THROUGHPUT:-1.0}" > "$AUTOTUNE_METRICS_PATH"
exec sleep "${STANDIN_SECONDS:-0.2}"
