"""compare_stop_rules.py with trimstop.py's patch applied (A/B only)."""
import runpy, sys
sys.path.insert(0, "docs/benchmarks/fit/trimstop_ab/zen5")
import trimstop_current  # noqa: F401  (applies ../trimstop.py's patch)
sys.argv = ["compare_stop_rules.py", *sys.argv[1:]]
runpy.run_path("examples/compare_stop_rules.py", run_name="__main__")
