#!/usr/bin/env bash
# The GPU check, offline, in under 8 minutes on one H200 (nothing is installed or downloaded):
#
#   1. the GPU test suite: python -m pytest -m cuda tests/test_cuda.py
#      (every op GPU vs CPU, each fused kernel vs its NumPy twin, flash attention fwd+bwd,
#      AdamW kernel, matmul precisions, tiny GPT steps, seeded repeatability, checkpoints)
#   2. python -m benchmarks.gpu_bench: fused kernels vs references at GPT-2 sizes, a tiny and
#      a gpt2-124M training step, tensorgrad vs PyTorch eager (TF32 off on both, B=8, T=1024,
#      tokens/s, ratio, MFU), a float32 GEMM's TFLOPS, attention memory vs T
#   3. gpt-train --device cuda: char-small for 300 steps on the repository's own text (the
#      machine is offline), the loss must fall; then KV-cached generation tokens/s (gpt2-124M)
#
# Usage (from anywhere):  bash benchmarks/gpu_check.sh
# Results: $OUT if set, else benchmarks/results/: gpu_tests.txt, gpu_tests.json,
# gpu_bench.json, gpu_bench.md (the Markdown tables are also printed). Exit status 0 when
# the tests pass and every benchmark section ran. Needs CuPy, a GPU, numpy, pytest; torch
# for the side-by-side numbers (skipped, and said so, without it). Runs from the source
# tree through PYTHONPATH, so `pip install -e .` is not needed.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
RESULTS="${OUT:-benchmarks/results}"
mkdir -p "$RESULTS"
status=0

echo "== 1/2 GPU tests (tests/test_cuda.py, tests/test_kernels.py: every CUDA kernel vs its reference)"
start=$(date +%s)
timeout 200 python -m pytest -m cuda tests/test_cuda.py tests/test_kernels.py -q -rs -p no:cacheprovider \
    2>&1 | tee "$RESULTS/gpu_tests.txt"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || status=1
python - "$RESULTS" "$rc" "$(( $(date +%s) - start ))" <<'EOF'
import json, sys
out, rc, secs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lines = open(f"{out}/gpu_tests.txt").read().strip().splitlines()
json.dump({"exit_code": rc, "timed_out": rc == 124, "seconds": secs,
           "summary": lines[-1] if lines else ""}, open(f"{out}/gpu_tests.json", "w"), indent=2)
EOF

echo "== 2/2 kernels, training steps, PyTorch side by side (benchmarks/gpu_bench.py)"
timeout 250 python -m benchmarks.gpu_bench --out "$RESULTS" --budget 220 || status=1

echo "== 3/3 gpt-train --device cuda (char-small, 300 steps) and KV-cached generation"
cat README.md tensorgrad/*.py tensorgrad/*/*.py gpt/*.py > "$RESULTS/corpus.txt"
timeout 150 python -m gpt.train --device cuda --preset char-small --data "$RESULTS/corpus.txt" \
    --max-iters 300 --eval-interval 100 --eval-iters 10 --out-dir "$RESULTS/train-cuda" \
    --no-sample --overwrite 2>&1 | tail -15 | tee "$RESULTS/gpt_train_cuda.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
timeout 60 python - "$RESULTS" <<'EOF' || status=1
import json, sys, time
import numpy as np
import tensorgrad as tg
from gpt import model as M
from gpt.config import GPTConfig
tg.manual_seed(0)
m = M.GPT(GPTConfig.from_preset("gpt2")).to("cuda")
prompt = np.random.default_rng(0).integers(0, 50257, (1, 512))
out = {}
for cache in (True, False):
    t0 = time.perf_counter()
    n = sum(1 for _ in m.generate_stream(prompt, 32, temperature=0.0, use_cache=cache))
    out["cached" if cache else "uncached"] = n / (time.perf_counter() - t0)
print("generation tokens/s at context 512:", {k: round(v, 1) for k, v in out.items()})
json.dump(out, open(f"{sys.argv[1]}/gpu_generate.json", "w"), indent=2)
EOF

echo "== done (status $status); results in $RESULTS"
exit $status
