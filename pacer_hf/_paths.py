"""Where pacer_hf's shipped files are: the `hub_cards/` folder (demo pair, pre-verifier, card templates).

In a source checkout (editable install) it is the repository's top-level `hub_cards/`; a built wheel
carries the same folder as `pacer_hf/hub_cards/` (setup.py maps it into the package).
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def hub_cards_dir() -> Path:
    """The `hub_cards/` folder: inside the installed package (wheel), else the checkout's top level."""
    packaged = PACKAGE_DIR / "hub_cards"
    return packaged if packaged.is_dir() else PACKAGE_DIR.parent / "hub_cards"
