"""`pacer-hf bench` with the first-round candidate installed for every pre-verifier in this process (a call's first
round is not counted as evidence about the pair, `first_round.py`), to measure it on pairs whose drafts cannot pay.
Arguments: those of `pacer-hf bench`.

    OMP_NUM_THREADS=1 python docs/benchmarks/epyc_zen5/bound/first_round/bench_first_round.py --target ... --draft ...
"""
import sys

import first_round  # this folder is on sys.path when the script runs

from pacer_hf.cli import main

first_round.install(marked_only=False)
sys.exit(main(["bench", *sys.argv[1:]]))
