#!/bin/bash
# Train, calibrate and ship the demo pair's pre-verifier:
#   hub_cards/demo-target + hub_cards/demo-draft  ->  hub_cards/demo-preverifier (config.json + model.safetensors)
# Traces: draft proposals at positions of stdlib files of the pair's *train* split (a random subset), plus the
# target's own greedy continuation (0..CONT tokens); the pair's *validation* files choose the setting, its *test*
# files (held out everywhere) give the reported table.
# Usage: WORK=/work/demo-pv TRAIN_FILES=250 PPT=16 PPT_EVAL=32 bash scripts/demo_preverifier.sh
set -euo pipefail
WORK=${WORK:-/work/demo-pv}
TRAIN_FILES=${TRAIN_FILES:-250}
PPT=${PPT:-16}
PPT_EVAL=${PPT_EVAL:-32}  # positions per validation/test file (more rounds: steadier AUC/ECE)
CONT=${CONT:-24}
NICE="nice -n ${NICE_LEVEL:-10}"
T=${TARGET:-hub_cards/demo-target}
D=${DRAFT:-hub_cards/demo-draft}
SPLITS=${SPLITS:-$T/corpus_splits.json}
OUT=${OUT:-hub_cards/demo-preverifier}
TOK=${TOKENIZER:+--tokenizer $TOKENIZER}
export OMP_NUM_THREADS=1
mkdir -p "$WORK"
python - "$WORK" "$TRAIN_FILES" "$SPLITS" <<'PY'
import json, random, sys, sysconfig
from pathlib import Path
work, n, splits_file = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
splits = json.loads(splits_file.read_text())
root = Path(sysconfig.get_paths()["stdlib"])
train = sorted(splits["train"]); random.Random(0).shuffle(train)
for name, files in (("train", train[:n]), ("validation", splits["validation"]), ("test", splits["test"])):
    (work / f"{name}.txt").write_text("".join(f"{root / f}\n" for f in files))
    print(name, len(files), "files")
PY
collect() {
  $NICE pacer-hf collect --target $T --draft $D $TOK --file-list "$WORK/$1.txt" --out "$WORK/traces-$1" \
    --max-draft-tokens 8 --positions-per-text "$2" --context 128 --batch-size 32 --target-continuation "$CONT"
}
collect train "$PPT" > "$WORK/collect-train.log" 2>&1 &
TRAIN_PID=$!
collect validation "$PPT_EVAL" > "$WORK/collect-validation.log" 2>&1
collect test "$PPT_EVAL" > "$WORK/collect-test.log" 2>&1
wait $TRAIN_PID
$NICE pacer-hf train --data "$WORK/traces-train" --eval-data "$WORK/traces-validation" --out "$WORK/pv" \
  --epochs "${EPOCHS:-8}" --lr 1e-3 --batch-size 64 | tee "$WORK/train.log"
$NICE pacer-hf calibrate --preverifier "$WORK/pv" --data "$WORK/traces-validation" --report-data "$WORK/traces-test" \
  --target $T --draft $D --repeats 30 --out "$OUT" | tee "$WORK/calibrate.log"
