"""compare_stop_rules.py with trimstop.py's patch applied (A/B only)."""
import runpy, sys
sys.path.insert(0, "/tmp/ab3")
import trimstop  # noqa: F401  (patches PacerStopRule.add_token)
sys.argv = ["compare_stop_rules.py", *sys.argv[1:]]
runpy.run_path("/tmp/benchtree1/examples/compare_stop_rules.py", run_name="__main__")
