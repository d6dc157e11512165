#!/bin/bash
# The suite sweep split over every GPU of this host: shard k of N runs on GPU k, then one table.
#   tools/sweep_all_gpus.sh OUT_DIR SECONDS [FILTER ...]
# e.g. tools/sweep_all_gpus.sh results/run 540 /elementwise/ /norm/ /reduction/ /softmax/
# Each shard is cut off after SECONDS; the rows it finished are kept in OUT_DIR/sweep_K.json.
set -u
OUT_DIR=$1; LIMIT=$2; shift 2
mkdir -p "$OUT_DIR"
N=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$N" -eq 0 ]; then echo "no GPU found (nvidia-smi -L lists none): the sweep needs one" >&2; exit 2; fi
ONLY=(); for f in "$@"; do ONLY+=(--only "$f"); done
for k in $(seq 0 $((N - 1))); do
  (export CUDA_VISIBLE_DEVICES=$k
   timeout "$LIMIT" python3 tools/bench_suite.py problems "${ONLY[@]}" --shard "$k/$N" \
     --no-profile --max-rounds 3 --warm-compile 8 --out "$OUT_DIR/sweep_$k.json" \
     > "$OUT_DIR/sweep_$k.txt" 2>&1) &
done
wait
python3 tools/bench_suite.py problems --merge "$OUT_DIR"/sweep_*.json \
  --group fusion=elementwise,norm,reduction,softmax --group library_and_models=gemm,conv,models
