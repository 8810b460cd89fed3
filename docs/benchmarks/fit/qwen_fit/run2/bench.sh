#!/bin/bash
cd /tmp/qfit3
uptime > /tmp/qbench3/uptime_start
OMP_NUM_THREADS=1 PYTHONPATH=/tmp/qfit3 /work/main/.venv/bin/python examples/compare_stop_rules.py \
  hub_cards/qwen-coder-preverifier /tmp/qfitwork/qwen-pv --pair qwen2.5-coder --hf --gammas 8 \
  --prompts 3 --runs 1 --max-new-tokens 64 --out /tmp/qbench3/results.json > /tmp/qbench3/log.txt 2>&1
uptime > /tmp/qbench3/uptime_end
