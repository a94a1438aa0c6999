#!/usr/bin/env bash
# The KV codec and attention-sweep benchmarks of `kvaudit quant`, each against a baseline
# measured in the same process: FP8 / NVFP4 encode+decode of 1 GiB of BF16 against memcpy
# of the same bytes (targets 0.60 and 0.30), and the 128K attention-error sweep against the
# machine's FMA peak (target 0.30). Both take the best of several rounds on each side.
# usage: tools/bench-quant.sh [BUILD_DIR]
set -eu
BUILD=${1:-build}
cmake --build "$BUILD" --target benchmarks > /dev/null  # not part of the default build
echo "== bench_codecs: 1 GiB BF16, 2 threads, best of 5"
"$BUILD/bench/bench_codecs" 1 2 5
echo "== bench_attention: 128K context, 8 KV heads x 128, 2 threads, best of 5 rounds"
"$BUILD/bench/bench_attention" 128k 2
