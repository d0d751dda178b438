"""The recipe at any size: one knob (a target active parameter count or a target compute), the
rest from declared rules (docs/ladder.md "The recipe at any size").

    rule = SizeRule.of_recipe(model, tokens=18.75e12, batch=11_264, seq_len=4096, lr=2.2e-4,
                              warmup_steps=2000, shape=FULL_SHAPE)
    s = rule.at(parse_size("1b"))       # Sized: the model's shape, tokens, batch, lr, FLOPs

What stays the recipe's, whatever the size: the mixture and its ratios, the tokenizer, the
pretrain -> midtrain switch (at the recipe's share, 80%), the routing geometry (experts, top-k,
shared experts, the score function), the attention pattern (sliding window, global layers) and
the optimizer (AdamW, betas, weight decay, the schedule's shape). What follows from the size:

- width: the grid point (a multiple of `width_step`) whose active parameters (or compute) lie
  nearest the target on a log scale;
- heads: width / head_dim (at least 1); kv heads: the largest divisor of the heads at most
  heads / kv_group; depth: width / width_per_layer (at least `min_layers`); or, for a shape that
  fixes them (the laptop's), the recipe's depth and heads at every size, a head width / heads
  wide; an expert's width: width / expert_div; a shared expert's: width x shared_mult;
- tokens: `tokens_per_param` x the active parameters (the recipe's own ratio: its tokens over its
  active parameters, so the recipe is a point of its rule; Gadre et al.: at a fixed ratio loss is
  a power law in compute);
- batch and peak learning rate: power laws of compute through the recipe's own point, with
  DeepSeek LLM's exponents (batch ~ C^0.3271, lr ~ C^-0.125; arXiv 2401.02954), the batch a
  multiple of `batch_multiple` sequences;
- warm-up: the recipe's share of the steps.

Active parameters are `steps.moe.config.param_counts`'s (both embedding matrices included);
compute is `flops_per_token` x the target tokens trained, the trainer's own MFU formula.
Torch-free (a dry-run imports this).
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

from executor import VoyageError
from steps.moe.config import MoEConfig, flops_per_token, param_counts

# DeepSeek LLM (arXiv 2401.02954, Sec. 3.1): B_opt = 0.2920 C^0.3271, eta_opt = 0.3118 C^-0.1250.
BATCH_EXPONENT = 0.3271
LR_EXPONENT = -0.1250


@dataclass(frozen=True)
class ShapeRule:
    """How a width becomes a model shape (the recipe's own shape at its own width)."""

    head_dim: int
    width_per_layer: int  # depth = width / this
    kv_group: int  # kv heads: the largest divisor of the heads <= heads / kv_group
    expert_div: int  # a routed expert's width = width / this
    shared_mult: float  # a shared expert's width = width x this
    width_step: int  # widths are multiples of this
    min_layers: int = 2
    max_width_steps: int = 4096
    # Fixed instead of grown (0: grown by the rules above). `layers`: every size has this depth.
    # `heads`: every size has these heads (and `kv_group`'s kv heads), each width / heads wide
    # (head_dim is then ignored), so attention is exactly as wide as the model at every size.
    layers: int = 0
    heads: int = 0

    def __post_init__(self) -> None:
        if self.heads and self.width_step % (2 * self.heads):
            raise VoyageError(f"shape: width_step {self.width_step} must be a multiple of 2 x heads ({self.heads}): "
                              f"a head's width (width / heads) must be even for the rotary embedding")

    def shape(self, base: MoEConfig, width: int) -> MoEConfig:
        heads = self.heads or max(1, round(width / self.head_dim))
        head_dim = width // self.heads if self.heads else self.head_dim
        want = max(1, heads // self.kv_group)
        kv = max(d for d in range(1, want + 1) if heads % d == 0)
        layers = self.layers or max(self.min_layers, round(width / self.width_per_layer))
        return dataclasses.replace(
            base, dim=width, n_heads=heads, n_kv_heads=kv, head_dim=head_dim, n_layers=layers,
            expert_dim=max(1, round(width / self.expert_div)),
            shared_expert_dim=max(1, round(width * self.shared_mult)))

    def overrides(self, base: MoEConfig, width: int) -> dict[str, int]:
        """The MoEConfig fields a width changes, as a ModelSpec's overrides."""
        m = self.shape(base, width)
        keys = ("dim", "n_heads", "n_kv_heads", "n_layers", "expert_dim", "shared_expert_dim")
        if self.heads:
            keys = keys + ("head_dim",)
        return {k: getattr(m, k) for k in keys}


# The 535B-A23B shape: 6144 wide, 48 heads of 128 (16 kv), 48 layers, experts 1536, shared 3072.
FULL_SHAPE = ShapeRule(head_dim=128, width_per_layer=128, kv_group=3, expert_div=4, shared_mult=0.5, width_step=128)
# The laptop's `tiny` shape: 64 wide, 4 heads of 16 (2 kv), 4 layers, experts 32, shared 64. At
# laptop widths (16-64) a depth of width/16 is flat at its minimum for the narrow rungs and then
# jumps (2, 2, 2, 3, 4 layers: the first ladder's rungs, docs/ladder.md "The laptop ladder's
# design"), so the laptop fixes depth and heads at the recipe's and grows only the width: every
# matrix then grows with it (attention 3 x width^2 a layer, experts and shared expert alike).
LAPTOP_SHAPE = ShapeRule(head_dim=16, width_per_layer=16, kv_group=2, expert_div=2, shared_mult=1.0, width_step=8,
                         layers=4, heads=4)


@dataclass(frozen=True)
class Size:
    """The one knob: an active parameter count or a compute (exactly one non-zero)."""

    params: float = 0.0
    flops: float = 0.0

    @property
    def label(self) -> str:
        if self.flops:
            return f"{self.flops:.2g}".replace("e+", "e") + "flops"
        return human(self.params).lower()


_UNITS = {"k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


def parse_size(text: str) -> Size:
    """`1b`, `300m`, `60k`, `1.2e9` (active parameters) or `3e21flops` (compute); else a
    VoyageError naming the field."""
    t = str(text).strip().lower().replace("_", "")
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(flops|[kmbt])?", t)
    if not m:
        raise VoyageError(f"size: {text!r} is neither active parameters (1b, 300m, 60k) nor a compute (3e21flops)")
    value = float(m.group(1))
    unit = m.group(2)
    if not value > 0 or not math.isfinite(value):
        raise VoyageError(f"size: must be positive, got {text!r}")
    if unit == "flops":
        return Size(flops=value)
    return Size(params=value * _UNITS.get(unit or "", 1.0))


def human(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.3g}"


@dataclass(frozen=True)
class Sized:
    """The recipe at one size: everything a training step needs that the size changes."""

    label: str
    model: MoEConfig
    overrides: dict
    total_params: int
    active_params: int
    tokens: float  # targets trained (steps x batch x (seq_len - 1))
    steps: int
    pretrain_steps: int
    batch: int  # sequences a step
    seq_len: int
    lr: float
    warmup_steps: int
    flops: float

    @property
    def pretrain_tokens(self) -> float:  # in mixture tokens (seq_len a sequence), as Scale counts them
        return self.pretrain_steps * self.batch * self.seq_len

    @property
    def midtrain_tokens(self) -> float:
        return (self.steps - self.pretrain_steps) * self.batch * self.seq_len

    def describe(self) -> str:
        m = self.model
        return (f"d={m.dim} x {m.n_layers} layers, {m.n_heads} heads ({m.n_kv_heads} kv), {m.n_experts} experts "
                f"top-{m.top_k}: {human(self.total_params)} total, {human(self.active_params)} active; "
                f"{human(self.tokens)} tokens in {self.steps:,} steps of {self.batch:,}; lr {self.lr:.3g}; "
                f"{self.flops:.3g} FLOPs")


@dataclass(frozen=True)
class SizeRule:
    """The declared rules of the recipe at any size (part of the identity of every step they
    size: each field is in the configs they produce, and the ladder's fit records the rule)."""

    base: MoEConfig  # the recipe's model (routing geometry, attention pattern, vocabulary)
    shape: ShapeRule
    tokens_per_param: float  # targets trained per active parameter
    seq_len: int
    anchor_flops: float  # the recipe's own compute: the batch and lr laws pass through its point
    anchor_batch: int
    anchor_lr: float
    warmup_share: float  # warm-up steps / all steps, the recipe's
    pretrain_share: float = 0.8  # the pretrain -> midtrain switch
    batch_exponent: float = BATCH_EXPONENT
    lr_exponent: float = LR_EXPONENT
    batch_multiple: int = 1
    min_batch: int = 4

    @classmethod
    def of_recipe(cls, base: MoEConfig, *, tokens: float, batch: int, seq_len: int, lr: float, warmup_steps: int,
                  shape: ShapeRule, pretrain_share: float = 0.8, batch_multiple: int = 1, min_batch: int = 4,
                  lr_exponent: float = LR_EXPONENT) -> "SizeRule":
        """The rule through the recipe's own point: its ratio, batch, lr and warm-up share.
        `tokens` are the recipe's mixture tokens (seq_len a sequence)."""
        steps = tokens / (batch * seq_len)
        targets = steps * batch * (seq_len - 1)
        _, active = param_counts(base)
        return cls(base=base, shape=shape, tokens_per_param=targets / active, seq_len=seq_len,
                   anchor_flops=flops_per_token(base, seq_len - 1) * targets, anchor_batch=batch, anchor_lr=lr,
                   warmup_share=warmup_steps / steps, pretrain_share=pretrain_share, batch_multiple=batch_multiple,
                   min_batch=min_batch, lr_exponent=lr_exponent)

    def widths(self) -> range:
        return range(self.shape.width_step, self.shape.width_step * self.shape.max_width_steps + 1, self.shape.width_step)

    def width_for(self, size: Size) -> int:
        """The grid width whose active parameters (or compute) lie nearest the size, in log."""
        want = size.flops or size.params
        best, best_d = 0, math.inf
        for w in self.widths():
            m = self.shape.shape(self.base, w)
            _, active = param_counts(m)
            got = self._flops(m, active) if size.flops else active
            d = abs(math.log(got / want))
            if d < best_d:
                best, best_d = w, d
            elif got > want:
                break  # monotone in the width: past the target, only farther
        return best

    def _flops(self, m: MoEConfig, active: int) -> float:
        return flops_per_token(m, self.seq_len - 1) * self.tokens_per_param * active

    def at(self, size: Size | str) -> Sized:
        if isinstance(size, str):
            size = parse_size(size)
        return self.at_width(self.width_for(size), size.label)

    def at_width(self, width: int, label: str = "") -> Sized:
        m = self.shape.shape(self.base, width)
        total, active = param_counts(m)
        c_est = self._flops(m, active)
        ratio = c_est / self.anchor_flops
        q = self.batch_multiple
        batch = max(self.min_batch, q * max(1, round(self.anchor_batch * ratio ** self.batch_exponent / q)))
        lr = self.anchor_lr * ratio ** self.lr_exponent
        targets_per_step = batch * (self.seq_len - 1)
        steps = max(10, round(self.tokens_per_param * active / targets_per_step))
        pre = round(self.pretrain_share * steps)
        if not 0 < pre < steps:
            raise VoyageError(f"size {label or width}: {steps} steps leave no pretrain or no midtrain steps")
        tokens = steps * targets_per_step
        return Sized(label=label or f"d{width}", model=m, overrides=self.shape.overrides(self.base, width),
                     total_params=total, active_params=active, tokens=tokens, steps=steps, pretrain_steps=pre,
                     batch=batch, seq_len=self.seq_len, lr=float(f"{lr:.6g}"),
                     warmup_steps=max(1, round(self.warmup_share * steps)),
                     flops=flops_per_token(m, self.seq_len - 1) * tokens)

    def describe(self) -> str:
        s = self.shape
        return (f"tokens {self.tokens_per_param:.4g} per active parameter; batch ~ C^{self.batch_exponent} and "
                f"lr ~ C^{self.lr_exponent:g} through the recipe ({self.anchor_batch:,} sequences, lr "
                f"{self.anchor_lr:g} at {self.anchor_flops:.3g} FLOPs); "
                + (f"{s.heads} heads of width/{s.heads}" if s.heads else f"heads of {s.head_dim}")
                + (f", {s.layers} layers at every width" if s.layers else f", a layer per {s.width_per_layer} of width")
                + f", kv heads 1/{s.kv_group}, experts width/{s.expert_div}, shared "
                f"x{s.shared_mult:g}; warm-up {self.warmup_share:.2%} of the steps; switch at "
                f"{self.pretrain_share:.0%}")


def gpu_hours(flops: float, peak_tflops: float, mfu: float) -> float:
    """GPU-hours of `flops` at `mfu` of `peak_tflops` a GPU."""
    return flops / (peak_tflops * 1e12 * mfu) / 3600.0
