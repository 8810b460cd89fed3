"""`pacer-hf bench` with the min-rounds candidate installed for every pre-verifier in this process (a call may go plain
only after 4 drafted rounds of its own besides MIN_TRIED judged tokens; a pair known not to pay still starts plain),
to measure what it costs on the pairs whose drafts cannot pay. Arguments: those of `pacer-hf bench`.

    OMP_NUM_THREADS=1 python docs/benchmarks/epyc_zen5/bound/min_rounds/bench_min_rounds.py --target ... --draft ...
"""
import sys

import min_rounds  # this folder is on sys.path when the script runs

from pacer_hf.cli import main

min_rounds.install(marked_only=False)
sys.exit(main(["bench", *sys.argv[1:]]))
