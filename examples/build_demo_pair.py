"""Rebuild the demo pair shipped in hub_cards/ (a thin wrapper over `pacer-hf build-demo-pair`).

    python examples/build_demo_pair.py                # stages one after another (any machine)
    python examples/build_demo_pair.py --parallel     # the two independent training chains as two
                                                      # 1-thread processes (how the shipped pair was
                                                      # built on a shared 2-core CPU)

Any other flag is passed to every stage, e.g. `--tiny --work-dir /tmp/x --out /tmp/y`.
"""

from __future__ import annotations

import os
import subprocess
import sys


def main(argv: list[str]) -> int:
    parallel = "--parallel" in argv
    rest = [a for a in argv if a != "--parallel"]
    env = {**os.environ, "PACER_DEMO_COMMAND": "python examples/build_demo_pair.py " + " ".join(argv)}

    def stage(*names: str) -> list[str]:
        cmd = " && ".join(
            subprocess.list2cmdline([sys.executable, "-m", "pacer_hf.cli", "build-demo-pair", "--stage", n, *rest])
            for n in names)
        return ["bash", "-c", cmd]

    if not parallel:
        return subprocess.call([sys.executable, "-m", "pacer_hf.cli", "build-demo-pair", *rest], env=env)
    if subprocess.call(stage("tokenizer", "data"), env=env):
        return 1
    threads = ["--threads", "1"] if "--threads" not in rest else []
    rest += threads
    chains = [subprocess.Popen(stage("target-base", "target"), env=env),
              subprocess.Popen(stage("draft", "distill"), env=env)]
    if any(chain.wait() for chain in chains):
        return 1
    return subprocess.call(stage("export"), env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
