"""The Pacer pre-verifier: a small causal transformer layer over the tokens drafted in a round.

Self-contained (torch, transformers and its dependencies, `configuration_pacer`; never the rest of pacer_hf) so a
Hub repository can carry it for `trust_remote_code=True`. Every drafted token i contributes the draft's last hidden
state h_i (input of the draft's `lm_head`) and three cheap features of the draft distribution; the layer outputs the
logit of "token i is accepted given tokens < i were accepted" (pacer_hf's docs/ALGORITHM.md). Publishing with a
model card is `pacer_hf.hub.push_preverifier`; `push_to_hub` is transformers' plain upload.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.utils import ModelOutput

from .configuration_pacer import NUM_DRAFT_FEATURES, NUM_LOOP_FEATURES, PacerConfig


def draft_features(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """(log p(token), entropy, p1 - p2) of the draft's raw logits `(..., vocab)` at the drafted ids `(...)`: raw
    logits keep the features identical between data collection and generation, whatever the sampling settings."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    probs = logp.exp()
    chosen = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).clamp_min(-30.0)
    entropy = -(probs * logp).sum(-1)
    top2 = probs.topk(2, dim=-1).values
    return torch.stack([chosen, entropy, top2[..., 0] - top2[..., 1]], dim=-1)


def loop_features(accepted: int, drafted: int, confidence: float, max_draft_tokens: int) -> list[float]:
    """What the loop knows when a round starts (`config.loop_features`): the previous round's accepted share of
    `max_draft_tokens`, 1.0 when it accepted all `max_draft_tokens` (as training rounds draft; a shorter round
    does not count), the target's probability of its last token. Before a call's first round: zeros."""
    if drafted <= 0:
        return [0.0, 0.0, 0.0]
    return [accepted / max_draft_tokens, float(accepted >= max_draft_tokens), float(confidence)]


def draft_signature(draft_config) -> dict:
    """The architecture facts a pre-verifier depends on; a draft that differs in any is refused."""
    text_config = draft_config.get_text_config() if hasattr(draft_config, "get_text_config") else draft_config
    return {key: getattr(text_config, key, None) for key in ("model_type", "hidden_size", "num_hidden_layers", "vocab_size")}


@dataclass
class PacerOutput(ModelOutput):
    """Per-token acceptance logits `(batch, tokens)`, with labels the training loss, and the layer's keys and
    values of every position so far as `cache` (pass them back to score the round's next block only; the name
    transformers uses from 5.24 on, which also renames a `past_key_values` field of any ModelOutput)."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    cache: tuple[torch.Tensor, torch.Tensor] | None = None


class PacerCausalLayer(nn.Module):
    """Pre-norm transformer layer with causal attention: a block sees the blocks drafted before it.

    Causal attention also makes right padding harmless in training, so no attention mask is needed.
    """

    def __init__(self, config: PacerConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.attn_norm = nn.LayerNorm(config.hidden_size)
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.out = nn.Linear(config.hidden_size, config.hidden_size)
        self.mlp_norm = nn.LayerNorm(config.hidden_size)
        self.mlp = nn.Sequential(
            nn.Linear(config.hidden_size, config.intermediate_size),
            nn.GELU(),
            nn.Linear(config.intermediate_size, config.hidden_size),
        )

    def forward(self, x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """`x` holds the round's next positions; `past` the keys and values of the positions before them
        (scoring a round block by block costs one block each time). Returns the output and all keys/values."""
        batch, length, width = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(batch, length, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        if past is not None:
            k, v = torch.cat((past[0], k), 2), torch.cat((past[1], v), 2)
        if past is None or length == 1:  # one new position sees every earlier one: no mask to build
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=past is None and length > 1)
        else:  # new positions see every earlier one and, causally, each other
            start = k.shape[2] - length
            mask = torch.arange(k.shape[2], device=x.device) <= torch.arange(start, k.shape[2], device=x.device)[:, None]
            attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.out(attn.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.mlp_norm(x)), (k, v)


class PacerPreVerifier(PreTrainedModel):
    """Lightweight, trainable pre-verification layer that decides when the draft stops drafting.

    Use [`PacerPreVerifier.from_draft`] to build an untrained one sized for a draft model,
    `from_pretrained` to load a trained one, and pass it as `pacer=` to an enabled model's `generate`.
    """

    config_class = PacerConfig
    base_model_prefix = "pacer"
    main_input_name = "draft_hidden_states"
    _no_split_modules = ["PacerCausalLayer"]

    def __init__(self, config: PacerConfig):
        super().__init__(config)
        width = config.hidden_size
        self.hidden_proj = nn.Linear(config.draft_hidden_size, width) if config.input_mode != "features" else None
        self.feature_proj = nn.Linear(NUM_DRAFT_FEATURES, width) if config.input_mode != "hidden" else None
        self.loop_proj = nn.Linear(NUM_LOOP_FEATURES, width) if getattr(config, "loop_features", False) else None
        self.position = nn.Embedding(config.max_draft_tokens, width)
        self.layer = PacerCausalLayer(config)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 1)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=self.config.initializer_range)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=self.config.initializer_range)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs) -> PacerPreVerifier:
        """As in transformers, but safetensors only: a pickle (`pytorch_model.bin`) can run code on load.

        A corrupt `model.safetensors` raises an OSError naming the file and how to replace it.
        """
        import os

        from safetensors import SafetensorError

        if kwargs.get("use_safetensors") is False:
            raise ValueError("PacerPreVerifier loads safetensors weights only (use_safetensors=False is refused).")
        kwargs["use_safetensors"] = True
        try:
            return super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        except SafetensorError as error:
            source = str(pretrained_model_name_or_path)
            name = "/".join(part for part in (kwargs.get("subfolder"), "model.safetensors") if part)
            path = os.path.join(source, name) if os.path.isdir(source) else f"{name} of {source}"
            if not os.path.isdir(source):  # a Hub repo: the copy in the local cache is the corrupt one
                from huggingface_hub import try_to_load_from_cache

                try:
                    cached = try_to_load_from_cache(source, name, cache_dir=kwargs.get("cache_dir"),
                                                    revision=kwargs.get("revision"))
                except ValueError:  # not a valid repo id
                    cached = None
                path = cached if isinstance(cached, str) else path
            raise OSError(
                f"{path} is not a readable safetensors file ({error}); it is corrupt or was cut short. "
                "Download it again (from_pretrained(..., force_download=True) for a Hub repo) or re-save the "
                "pre-verifier with save_pretrained."
            ) from error
        except OSError as error:
            message = str(error)
            if "model.safetensors" not in message or not ("no file named" in message or "cannot be loaded" in message):
                raise
            raise OSError(
                f"{pretrained_model_name_or_path} has no model.safetensors: PacerPreVerifier loads safetensors "
                "weights only (a pickle such as pytorch_model.bin can run code when loaded)."
            ) from error

    @classmethod
    def from_other_copy(cls, module: nn.Module) -> PacerPreVerifier:
        """This class's twin of a pre-verifier built by another copy of this code (pacer_hf or Hub remote code).

        transformers imports remote code as its own module, so `isinstance` fails across copies; config
        and weights define a pre-verifier, so they are carried over.
        """
        if isinstance(module, cls):
            return module
        config = getattr(module, "config", None)
        if getattr(config, "model_type", None) != PacerConfig.model_type:
            raise TypeError(f"{type(module).__name__} is not a Pacer pre-verifier.")
        local = cls(PacerConfig(**config.to_dict()))
        local.load_state_dict(module.state_dict())
        parameter = next(module.parameters(), None)
        if parameter is not None:
            local.to(device=parameter.device, dtype=parameter.dtype)
        return local.train(module.training)

    @classmethod
    def from_draft(cls, draft_model: PreTrainedModel, **config_overrides) -> PacerPreVerifier:
        """An untrained pre-verifier sized for `draft_model` (its hidden size, vocabulary, name)."""
        lm_head = draft_model.get_output_embeddings()
        if lm_head is None or not hasattr(lm_head, "weight"):
            raise ValueError(
                f"draft_model ({type(draft_model).__name__}) has no output embeddings (`lm_head`); "
                "Pacer needs a causal LM draft."
            )
        defaults = {
            "draft_hidden_size": int(lm_head.in_features),
            "draft_model": getattr(draft_model, "name_or_path", None) or None,
            "draft_signature": draft_signature(draft_model.config),
        }
        config = PacerConfig(**{**defaults, **config_overrides})
        return cls(config)

    def forward(self, draft_hidden_states: torch.Tensor, draft_features: torch.Tensor, labels: torch.Tensor | None = None,
                return_dict: bool | None = None, cache: tuple[torch.Tensor, torch.Tensor] | None = None,
                loop_features: torch.Tensor | None = None, **kwargs) -> PacerOutput:
        """Per-token acceptance logits for `(batch, tokens, ...)` inputs of one drafting round each.

        `labels` hold the acceptance target in [0, 1] per token (soft labels allowed) and -100 on
        padding; the loss is binary cross-entropy with `config.reject_weight` on the reject class.
        With `cache` (the previous call's `.cache`, same round) the inputs are the round's
        next tokens only, and the logits are theirs: the same as a full re-run, at the cost of the new block.
        `loop_features` `(batch, 3)`: the round's `loop_features(...)`, required when `config.loop_features`.
        """
        start = 0 if cache is None else cache[0].shape[2]
        length = draft_features.shape[1]
        if start + length > self.config.max_draft_tokens:
            raise ValueError(f"{start + length} drafted tokens exceed max_draft_tokens={self.config.max_draft_tokens}.")
        dtype = self.position.weight.dtype
        x = self.position.weight[start : start + length].unsqueeze(0)
        if self.hidden_proj is not None:
            x = x + self.hidden_proj(draft_hidden_states.to(dtype))
        if self.feature_proj is not None:
            x = x + self.feature_proj(draft_features.to(dtype))
        if self.loop_proj is not None:
            if loop_features is None:
                raise ValueError("This pre-verifier reads the loop's state (config.loop_features): pass loop_features "
                                 "(batch, 3), see modeling_pacer.loop_features.")
            x = x + self.loop_proj(loop_features.to(dtype))[:, None, :]
        x, present = self.layer(x, cache)
        logits = self.head(self.norm(x)).squeeze(-1)
        loss = None
        if labels is not None:
            mask = labels >= 0
            target = labels.clamp(0, 1).to(logits.dtype)
            weight = (target + (1 - target) * self.config.reject_weight) * mask
            loss = F.binary_cross_entropy_with_logits(logits, target, weight=weight, reduction="sum")
            loss = loss / weight.sum().clamp_min(1e-8)
        return PacerOutput(loss=loss, logits=logits, cache=present)

    def check_draft(self, draft_model: PreTrainedModel) -> None:
        """Refuse a draft other than the one this pre-verifier reads (hidden size, architecture); features only (any
        hidden size) and no `draft_signature` (the default pre-verifier): any draft passes, it reads what all give."""
        config = self.config
        if config.input_mode == "features" and not config.draft_signature:
            return
        lm_head = draft_model.get_output_embeddings()
        hidden = int(lm_head.in_features) if lm_head is not None else None
        if config.input_mode != "features" and hidden != config.draft_hidden_size:
            raise ValueError(
                f"The pre-verifier expects draft hidden size {config.draft_hidden_size}, the draft has {hidden}: it "
                f"was built for another draft ({config.draft_model or 'unnamed'}). Use a pre-verifier trained for "
                "this draft, or PacerPreVerifier.from_draft(draft) and train it."
            )
        recorded, actual = config.draft_signature, draft_signature(draft_model.config)
        if recorded and any(recorded.get(k) not in (None, v) for k, v in actual.items()):
            raise ValueError(
                f"The pre-verifier was trained for draft {config.draft_model or ''} {recorded}, but the draft is "
                f"{actual}. Use a pre-verifier trained for this draft."
            )

    def decide(self, token_logits: torch.Tensor | list[float], costs: dict | None = None) -> tuple[bool, int]:
        """After a block: `(stop, trim)`. The whole Pacer decision, given the round's acceptance logits.

        `decision_rule="block"`: the block passes when its predicted survival (product of its tokens'
        acceptance probabilities) is at least `threshold`; `"cumulative"` uses the whole round's; threshold
        0 always passes, 1 never does. `"expected_gain"`: drafting goes on while some longer draft (more
        blocks, up to `max_draft_tokens`) is expected to yield more tokens per unit of time than stopping
        now, under the calibrated cost model (`expected_gain_continues`). A stopped round's last block is
        sent whole (stop-only, exact under sampling) unless `trim_failed_block` (greedy only), which proposes
        a prefix of the drafted tokens instead: under "expected_gain" the one with the highest expected rate, the
        drafting already paid (`best_prefix`); under the threshold rules the failed block up to its first token
        below `trim_cutoff`. `costs` (expected_gain): `{"round_cost": [...], "draft_cost": ...}` measured where the call
        runs; without them, `config.calibration`."""
        config = self.config
        values = token_logits.float().tolist() if isinstance(token_logits, torch.Tensor) else token_logits
        probs = [acceptance_probability(x) for x in values]
        block = probs[-config.block_size :]
        if config.decision_rule == "expected_gain":
            if expected_gain_continues(probs, config.block_size, config.max_draft_tokens, costs or config.calibration,
                                       trim=config.trim_failed_block):
                return False, 0
        else:
            survival = math.prod(block if config.decision_rule == "block" else probs)
            if config.threshold <= 0.0 or (config.threshold < 1.0 and survival >= config.threshold):
                return False, 0
        if not config.trim_failed_block:
            return True, 0
        if config.decision_rule == "expected_gain":
            return True, len(probs) - best_prefix(probs, costs or config.calibration)
        kept = 0
        while kept < len(block) and block[kept] >= config.trim_cutoff:
            kept += 1
        return True, len(block) - kept


def round_cost(table: list[float], k: int) -> float:
    """`table[k]`, extended linearly past its end (k = 0 is the first entry)."""
    if k < len(table):
        return table[k]
    return table[-1] + (table[-1] - table[-2] if len(table) > 1 else 0.0) * (k - len(table) + 1)


def acceptance_probability(logit: float) -> float:
    """An acceptance logit as a probability (clamped: a float logit far out of range must not overflow `exp`)."""
    return 1.0 / (1.0 + math.exp(-min(max(logit, -60.0), 60.0)))


def calibrated_round_time(costs: dict):
    """time(k): a round drafting k tokens in target steps under a calibration dict: `round_cost[k]` when measured
    inside generate, else k*draft_cost + verify_cost[k] + round_overhead; plus preverifier_cost per token."""
    call = costs.get("preverifier_cost", 0.0)
    if costs.get("round_cost"):
        return lambda k: round_cost(costs["round_cost"], k) + k * call
    draft, table, overhead = costs["draft_cost"], costs["verify_cost"], costs.get("round_overhead", 0.0)
    return lambda k: k * (draft + call) + round_cost(table, k) + overhead


def expected_tokens(probs: list[float]) -> list[float]:
    """Per k = 0..len(probs): the expected tokens of a round proposing the first k drafted tokens, the target's own
    included: 1 + sum_{i<k} prod_{j<=i} probs[j] (`probs[i]`: token i accepted given those before it were)."""
    tokens, alive = [1.0], 1.0
    for x in probs:
        alive *= x
        tokens.append(tokens[-1] + alive)
    return tokens


def _prefix_rates(probs: list[float], costs: dict) -> list[float]:
    """Per k = 0..len(probs): expected tokens per unit of time proposing the first k of n drafted tokens, at
    time(k) + (n - k) * (draft_cost + preverifier_cost): the drafting is paid, only the verify width changes."""
    time, n, tokens = calibrated_round_time(costs), len(probs), expected_tokens(probs)
    per_token = costs["draft_cost"] + costs.get("preverifier_cost", 0.0)
    return [tokens[k] / (time(k) + (n - k) * per_token) for k in range(n + 1)]


def best_prefix(probs: list[float], costs: dict) -> int:
    """How many drafted tokens to propose (greedy only): the best expected rate, ties to the shorter prefix as in the
    rule's other copies (docs/ALGORITHM.md, "The best prefix")."""
    rates = _prefix_rates(probs, costs)
    return rates.index(max(rates))


def stop_rate(probs: list[float], costs: dict) -> float:
    """The best expected rate of stopping now with a prefix of the drafted tokens, none included (greedy only), the
    drafting paid: where a narrow verify costs two steps, a doubtful round may be worth ending with a plain step."""
    return max(_prefix_rates(probs, costs))


def expected_gain_continues(probs: list[float], block_size: int, max_tokens: int, costs: dict, trim: bool = False) -> bool:
    """Whether drafting more blocks is expected to pay, after `len(probs)` drafted tokens (`rows_continue` for one row).

    `probs[i]`: the chance token i is accepted given those before it were; a round of n drafted tokens yields
    `expected_tokens(probs)[n]` in `calibrated_round_time(costs)(n)`; tokens not drafted yet are predicted accepted
    with the last block's mean. Drafting continues while some longer round, up to `max_tokens`, has a higher expected
    rate than stopping now; with `trim` (greedy only) stopping now proposes the best prefix, none included."""
    time = calibrated_round_time(costs)
    return rows_continue([probs], [True], block_size, max_tokens, time, stop_rate(probs, costs) if trim else None)


def rows_continue(probs: list[list[float]], open_rows: list[bool], block_size: int, max_tokens: int, time,
                  rate_now: float | None = None) -> bool:
    """The expected-gain rule for rows that draft together (one row: `expected_gain_continues`; a padded batch:
    `pacer_batch_stop="batch"`, where one more block widens every row's verify slot, paid whether a row fills it
    or not). `time(n)`: a round of n drafted tokens (per row). Drafting goes on while some longer round is expected
    to yield more tokens, summed over the rows, per unit of time; rows that cannot draft on (`open_rows` False:
    EOS, length limit) count as they are. `rate_now`: the rate of stopping now when it is not the whole round's
    (a trimming rule's `stop_rate`)."""
    n = max(len(p) for p in probs)
    survival, future, tokens = [], [], 0.0
    for p, open_row in zip(probs, open_rows):
        tokens += expected_tokens(p)[-1]
        survival.append(math.prod(p) if open_row else 0.0)
        future.append(sum(p[-block_size:]) / max(len(p[-block_size:]), 1))
    rate_now = tokens / time(n) if rate_now is None else rate_now
    for extra in range(1, (max_tokens - n) // block_size + 1):
        for _ in range(block_size):
            for b in range(len(survival)):
                survival[b] *= future[b]
                tokens += survival[b]
        if tokens / time(n + extra * block_size) > rate_now:
            return True
    return False


# save_pretrained writes `auto_map` and the code files: AutoModel loads the repo with trust_remote_code=True.
PacerPreVerifier.register_for_auto_class("AutoModel")
