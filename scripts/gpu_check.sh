#!/usr/bin/env bash
# The GPU lane (docs/GPU.md): one run on a machine with a CUDA GPU checks pacer_hf's decode path there and
# measures the demo pair. Usage, from the repository root:
#
#     bash scripts/gpu_check.sh OUT_DIR
#
# 1. installs the wheels carried in .whl/ (transformers in the supported span, and what its import checks)
#    into /tmp/site, without network, when the interpreter's transformers is outside >=5.21,<5.25;
# 2. `pacer-hf bench` on the demo pair, greedy (the target alone, sd-fixed γ sweep, HF's schedules, Pacer, PEARL),
#    then T = 1 (one run, fewer strategies), each copied into OUT_DIR as soon as it ends;
# 3. the batch bench (B = 1, 4, 8);
# 4. on request (GPU_CHECK_STEPS): one round profiled (scripts/gpu_profile_round.py), `pacer-hf fit` and its bench;
# 5. runs the CUDA tests (pytest -m cuda: tests/test_cuda.py, tests/test_cuda_sampling.py);
# 6. writes OUT_DIR/summary.txt: versions, each step's exit status and seconds, the figures.
#
# Every step runs under its own `timeout` and a failing step does not stop the later ones. The default steps end
# inside one 10-minute device call (install ~0.5, then at most: bench 2.5, bench-t1 2, batch 1.3, tests 4; measured
# 7.8 minutes on an H200), measurements first, so a run cut short still brings them back. A device call returns at
# most 8 files, so the default steps write 7: summary.txt, tests.log, steps.log (every other step's output) and the
# JSON results (`pacer-hf bench --report-only --out DIR` renders results.md from results.json and run.json; the
# profile and the fit add profile.json, fit_card.md and fit-bench_results.json).
# Without CUDA (GPU_CHECK_DEVICE=cpu, or none visible) the CUDA tests skip and the benches run tiny on the CPU:
# a dry run of the script itself.
set -u
OUT=${1:?usage: bash scripts/gpu_check.sh OUT_DIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python3}
SITE=${GPU_CHECK_SITE:-/tmp/site}
WORK=$(mktemp -d /tmp/gpu_check.XXXXXX)
SUMMARY="$OUT/summary.txt"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONDONTWRITEBYTECODE=1
T0=$(date +%s)
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

# GPU_CHECK_STEPS picks steps (default "bench bench-t1 batch tests"; on request "profile", and "fit fit-bench":
# `pacer-hf fit` on the device for the demo pair, then its pre-verifier in the bench), e.g. the benches alone.
STEPS=" ${GPU_CHECK_STEPS:-bench bench-t1 batch tests} "  # also: profile fit fit-bench

# step NAME SECONDS LOG CMD...: run CMD under a timeout, output appended to LOG; record its status and time.
step() {
    local name=$1 limit=$2 log=$3 start rc
    shift 3
    case "$STEPS" in *" $name "*) ;; *) note "step $name: skipped (GPU_CHECK_STEPS)"; return 0 ;; esac
    start=$(date +%s)
    echo "=== $name: $* (limit ${limit}s)" >>"$log"
    timeout -k 10 "$limit" "$@" >>"$log" 2>&1
    rc=$?
    note "step $name: rc=$rc$([ "$rc" = 124 ] && echo ' (timed out)') in $(($(date +%s) - start)) s"
    return 0
}

supported() { "$PY" -c "import sys, transformers as t; v = tuple(int(x) for x in t.__version__.split('.')[:2]); sys.exit(not (5, 21) <= v < (5, 25))" 2>/dev/null; }

# 1. wheels: only when the interpreter's own transformers is outside the supported span
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if ! supported; then
    if ls .whl/*.whl >/dev/null 2>&1; then
        # again whenever .whl/ holds other wheels than the ones installed (a warm machine keeps $SITE)
        if [ "$(ls .whl)" != "$(cat "$SITE/.wheels" 2>/dev/null)" ]; then
            "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
                .whl/*.whl >"$WORK/pip.log" 2>&1 && ls .whl >"$SITE/.wheels" \
                || { note "pip install failed:"; tail -5 "$WORK/pip.log" | tee -a "$SUMMARY"; }
        fi
        export PYTHONPATH=$SITE:$PYTHONPATH
    else
        note "transformers outside >=5.21,<5.25 and no .whl/ folder: the steps below will fail at import"
    fi
fi

DEVICE=${GPU_CHECK_DEVICE:-$("$PY" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')" 2>/dev/null || echo cpu)}
{
    echo "# gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ), device $DEVICE, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: none"
    "$PY" - <<'EOF'
import platform, torch, transformers, numba, pacer_hf
print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), transformers "
      f"{transformers.__version__}, numba {numba.__version__}, pacer_hf from {pacer_hf.__file__}")
print("GPU:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
EOF
} 2>&1 | tee -a "$SUMMARY"
nvidia-smi >"$OUT/tests.log" 2>&1 || true

# 2. the demo pair, batch 1 (greedy: every output checked identical to the target alone; T = 1 beside it)
CONFIDENCE=hf-confidence
"$PY" -c "import sklearn" 2>/dev/null || CONFIDENCE=hf-confidence-static  # the stock schedule re-tunes with sklearn
if [ "$DEVICE" = cuda ]; then
    SIZE=(--prompts 2 --runs 2 --max-new-tokens 96) CATEGORIES=stdlib-continuation,docstring-to-body,boilerplate
    GAMMAS=sd-fixed-2,sd-fixed-4,sd-fixed-6,sd-fixed-8,sd-fixed-10 BATCH=(--batch-sizes 1,4,8 --prompts 8 --max-new-tokens 48)
else  # the dry run: every strategy once, tiny
    SIZE=(--prompts 1 --runs 1 --max-new-tokens 12 --threads 1) CATEGORIES=stdlib-continuation
    GAMMAS=sd-fixed-2,sd-fixed-6 BATCH=(--batch-sizes 1,2 --prompts 2 --max-new-tokens 8 --strategies ar,sd-fixed-2,pacer --threads 1)
fi
# the demo pair's held-out split names stdlib files of the Python that built it; keep those this Python has
"$PY" - >"$WORK/heldout.txt" <<'EOF'
import sysconfig
from pathlib import Path
from pacer_hf.data.prompts import pair_held_out_files
root = Path(sysconfig.get_paths()["stdlib"])
print("\n".join(str(p) for p in (root / f for f in pair_held_out_files("hub_cards/demo-target")) if p.is_file()))
EOF
BENCH=(-m pacer_hf.cli bench --device "$DEVICE" --quick --no-plots --no-progress --prompt-tokens 128
    --categories "$CATEGORIES" --heldout-files "$WORK/heldout.txt" --overwrite)
keep() { for file in "$@"; do [ -f "$WORK/$file" ] && cp "$WORK/$file" "$OUT/${file/\//_}"; done; return 0; }
step bench 150 "$OUT/steps.log" "$PY" "${BENCH[@]}" --strategies "ar,$GAMMAS,hf-heuristic,$CONFIDENCE,pacer,pearl" \
    --temperatures 0 "${SIZE[@]}" --out "$WORK/bench"
keep bench/results.json bench/run.json  # at once: a run cut short still brings them back
# T = 1: one run, the fixed lengths that lead greedy on this pair, HF's default schedule, Pacer
step bench-t1 120 "$OUT/steps.log" "$PY" "${BENCH[@]}" --strategies "ar,sd-fixed-2,sd-fixed-4,sd-fixed-6,$CONFIDENCE,pacer" \
    --temperatures 1 "${SIZE[@]}" --runs 1 --out "$WORK/bench-t1"
keep bench-t1/results.json

# 3. the batch bench (greedy rows checked identical to the target's own batched generate)
step batch 80 "$OUT/steps.log" "$PY" -m pacer_hf.cli bench --device "$DEVICE" --no-plots --no-progress \
    --categories stdlib-continuation --runs 1 "${BATCH[@]}" --heldout-files "$WORK/heldout.txt" --out "$WORK/batch" --overwrite
keep batch/batch.json

# 4. one round profiled: where the time goes with and without CUDA graphs
PROFILE=(--repeats 3 --max-new-tokens 96)
[ "$DEVICE" = cuda ] || PROFILE=(--repeats 1 --max-new-tokens 12)
step profile 70 "$OUT/steps.log" "$PY" scripts/gpu_profile_round.py --device "$DEVICE" "${PROFILE[@]}" --out "$OUT/profile.json"

# 4b. `pacer-hf fit` on the device for the demo pair (a short budget), then the fitted pre-verifier in the bench
if [ "$DEVICE" = cuda ]; then FIT=(--budget-minutes 2 --device cuda) FIT_SIZE=(--prompts 2 --runs 1 --max-new-tokens 96)
else FIT=(--budget-minutes 1 --device cpu --threads 1) FIT_SIZE=(--prompts 1 --runs 1 --max-new-tokens 12 --threads 1); fi
step fit 200 "$OUT/steps.log" "$PY" -m pacer_hf.cli fit --target hub_cards/demo-target --draft hub_cards/demo-draft \
    --out "$WORK/fit" --no-progress "${FIT[@]}"
if [ -f "$WORK/fit/config.json" ] || [ -d "$WORK/fit/greedy" ]; then
    cp "$WORK/fit/README.md" "$OUT/fit_card.md" 2>/dev/null
    step fit-bench 120 "$OUT/steps.log" "$PY" "${BENCH[@]}" --preverifier "$WORK/fit" \
        --strategies "ar,sd-fixed-4,sd-fixed-8,$CONFIDENCE,pacer" --temperatures 0 "${FIT_SIZE[@]}" --out "$WORK/fit-bench"
    keep fit-bench/results.json
fi

# 5. the CUDA tests (skipped, not failed, without a CUDA device)
step tests 240 "$OUT/tests.log" "$PY" -m pytest -q -p no:cacheprovider -m cuda -rxXfE --durations=12 \
    tests/test_cuda.py tests/test_cuda_sampling.py
note "tests: $(grep -E '^[0-9]+ (passed|failed|skipped|error)|^=+ .*(passed|failed|skipped|error)' "$OUT/tests.log" | tail -1)"

# 6. the figures: speed against the target alone, Pacer against the best fixed γ, the pre-verifier's share
"$PY" - "$WORK" <<'EOF' 2>&1 | tee -a "$SUMMARY"
import json, statistics, sys
from collections import defaultdict
from pathlib import Path

work = Path(sys.argv[1])
path = work / "bench" / "results.json"
if path.is_file():
    records = json.loads(path.read_text())
    keys = ("tokens_per_s", "speedup_vs_ar", "speedup_vs_best_fixed", "tau", "mean_draft_len", "preverifier_overhead")
    print("bench, per category (results.json):")
    by_strategy = defaultdict(list)
    for r in records:
        by_strategy[f"{r['strategy']} T={r.get('temperature')}"].append(r)
        shown = ", ".join(f"{k}={r[k]:.3f}" for k in keys if isinstance(r.get(k), (int, float)))
        print(f"  {r['strategy']:<22} T={r.get('temperature')} {r['category']:<20} {shown}")
    print("bench, median over categories:")
    for name, rows in by_strategy.items():
        medians = {k: statistics.median(r[k] for r in rows) for k in keys
                   if all(isinstance(r.get(k), (int, float)) for r in rows)}
        print(f"  {name:<28} " + ", ".join(f"{k}={v:.3f}" for k, v in medians.items()))
else:
    print("bench: no results.json")
path = work / "batch" / "batch.md"
print("batch:\n" + path.read_text() if path.is_file() else "batch: no batch.md")
EOF
note "total $(($(date +%s) - T0)) s"
rm -rf "$WORK"
