"""Packaging beyond pyproject.toml: what the wheel carries besides the pacer_hf/ modules.

- The top-level hub_cards/ folder (demo pair, demo pre-verifier, model-card templates) stays where the
  Hub-format folders are built and published from; `package_dir` maps it to `pacer_hf/hub_cards` in a
  wheel. Code finds it through `pacer_hf._paths.hub_cards_dir()` in both layouts.
- The `evaluate` metric folder pacer_hf/bench/metrics/speculative_stats/ (loaded by path, so it has no
  `__init__.py`) is package data of `pacer_hf.bench.metrics`.

Data is listed explicitly (include_package_data=False), so nothing else slips into the wheel.
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["pacer_hf", "pacer_hf.*"]), "pacer_hf.hub_cards"],
    package_dir={"pacer_hf.hub_cards": "hub_cards"},
    package_data={"pacer_hf.hub_cards": ["**/*"], "pacer_hf.bench.metrics": ["speculative_stats/*"]},
    include_package_data=False,
)
