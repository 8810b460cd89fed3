"""The pipelines that built the shipped artifacts in hub_cards/ (the demo pair, the SmolLM2 draft, the lookup
gates), each a sequence of pacer_hf.training and pacer_hf.costs calls with its own command and work folder."""
