#!/bin/bash
# live A/B on the Qwen pair, EPYC, 1 thread: shipped vs fitted vs default pre-verifier, fixed γ 8, HF schedules
cd /tmp/qfit
uptime > /tmp/qbench/uptime_start
OMP_NUM_THREADS=1 PYTHONPATH=/tmp/qfit /work/main/.venv/bin/python examples/compare_stop_rules.py \
  hub_cards/qwen-coder-preverifier /tmp/qfitwork/qwen-pv default --pair qwen2.5-coder --hf --gammas 8 \
  --prompts 3 --runs 1 --max-new-tokens 64 --out /tmp/qbench/results.json > /tmp/qbench/log.txt 2>&1
uptime > /tmp/qbench/uptime_end
