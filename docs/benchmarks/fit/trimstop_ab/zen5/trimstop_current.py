"""A/B only (not in the package): ../trimstop.py's patch on the current code, where the acceptance helper it calls
is named `acceptance_probability`. Run: python trimstop.py <pacer-hf bench args>."""
import sys
from pathlib import Path

from pacer_hf.loops import stop_rule

stop_rule._probability = stop_rule.acceptance_probability
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import trimstop  # noqa: E402,F401  (patches PacerStopRule.add_token)

if __name__ == "__main__":
    from pacer_hf.cli import main
    sys.exit(main(sys.argv[1:]))
