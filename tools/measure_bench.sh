#!/bin/bash
# The measurements of the bench command on one GPU machine, in one run:
#   tools/measure_bench.sh KERNELBENCH_LEVELS_DIR OUT_DIR
# (KERNELBENCH_LEVELS_DIR holds level1/ level2/ level3/, e.g. KernelBench/KernelBench.)
# 1. the project's suite and KernelBench levels 1-3 with the local executor;
# 2. Ray on one GPU against the local executor (the suite's fusion folders, both ways);
# 3. Ray fanning compile-only work over 1, 2, 4 and 8 CPUs (level 1, GPU hidden).
# Each sweep resumes when the script is run again; the tables go to OUT_DIR/tables.md.
set -eu
KB=$1; OUT=$2
mkdir -p "$OUT"
BENCH=(python3 -m stitch_graph.cli bench)
"${BENCH[@]}" problems --out "$OUT/suite" --no-profile
for level in level1 level2 level3; do
  "${BENCH[@]}" "$KB/$level" --out "$OUT/kb_$level" --no-profile --max-rounds 3
done
FUSION=(--only elementwise/ --only norm/ --only reduction/ --only softmax/)
"${BENCH[@]}" problems "${FUSION[@]}" --out "$OUT/one_gpu_local" --no-profile
"${BENCH[@]}" problems "${FUSION[@]}" --out "$OUT/one_gpu_ray" --no-profile --ray local
for cpus in 1 2 4 8; do
  # a fresh nvcc cache per sweep, so each one builds everything
  CUDA_VISIBLE_DEVICES= STITCH_CACHE_DIR="$OUT/cache_cpus_$cpus" \
    "${BENCH[@]}" "$KB/level1" --out "$OUT/compile_only_cpus_$cpus" \
    --no-knowledge --max-rounds 1 --ray local --ray-cpus "$cpus"
done
{
  python3 tools/bench_tables.py "$OUT/suite" "$OUT"/kb_level*
  echo "### Ray against the local executor on one GPU"
  python3 tools/bench_tables.py --compare "$OUT/one_gpu_local" "$OUT/one_gpu_ray"
  for cpus in 1 2 4 8; do
    echo "### compile-only on Ray, $cpus CPUs"
    python3 tools/bench_tables.py --compare "$OUT/compile_only_cpus_1" "$OUT/compile_only_cpus_$cpus"
  done
} > "$OUT/tables.md"
echo "tables: $OUT/tables.md"
