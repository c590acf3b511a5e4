"""Draft heads: EAGLE-1, EAGLE-3 and Medusa.

Both read, at committed position j, what the target computed there (`reads`: EAGLE-1 its final
feature f[j], EAGLE-3 the hidden states entering three of its layers) together with the token
t[j+1], and predict a hidden state from which the next token is drafted. `lift` maps what the
target gives into the head's hidden space; a draft step reads its parent's predicted hidden
state instead. So drafting, training and evaluation run the same `unroll`.

EAGLE-1 (`EagleHead`): fc(concat(embed(t[j+1]), f[j])) -> decoder layer(s) of the target's
family (the first without its input norm, no final norm) -> the target's frozen LM head. Only
`fc` and `layers` are trained; the predicted hidden state is a predicted target feature.

EAGLE-3 (`Eagle3Head`): h = fc(concat(low, mid, high)) (3H -> H, no bias); one decoder layer
whose attention reads concat(input_norm(embed(t[j+1])), hidden_norm(h)) (q/k/v take 2H) with
the residual on h; its output, after a final `norm`, goes through the head's own LM head over
the draft vocabulary. Everything but the embedding is trained.

Medusa (`MedusaHead`, Medusa-1: the target frozen): K heads on the target's final feature f[j]
alone, head k (k = 1..K) predicting token t[j+k+1], one past what the target's own LM head gives;
each head is a residual block f + SiLU(W f + b) followed by the target's frozen LM head. Its
`unroll` returns the K heads' hidden states side by side (step k - 1 is head k), so training and
evaluation run the code EAGLE's do, and its "n-alpha" is head n+1's top-1 agreement with the
target's greedy token on true features (Medusa's head accuracy).

The frozen embedding (and EAGLE-1's and Medusa's LM head) are the target's own tensors, shared,
never copied into the checkpoint. With a reduced draft vocabulary a head proposes only from `draft_vocab`
(target ids).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eaglespec.errors import InvalidArgumentError
from eaglespec.models.config import ModelConfig
from eaglespec.models.decoder import (MLP, Attention, Decoder, KVCache, Layer, Linear, RMSNorm, Stack, invariant_linear,
                                      pack_weight, packed_linear)
from eaglespec.models.kernels import plain_cpu
from eaglespec.models.quantize import QuantizedLinear, quantize

# What an EAGLE-1 head reads at position j (paper Fig. 8): feature f[j] and/or a token embedding.
INPUT_VARIANTS = ("feature+shifted-token", "feature+unshifted-token", "feature", "token")
HEAD_TYPES = ("eagle1", "eagle3", "medusa")


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's low / middle / high layers as vLLM picks them: the hidden states entering layers
    2, N // 2 and N - 3 (vLLM's `eagle_aux_hidden_state_layer_ids`)."""
    return 2, num_layers // 2, num_layers - 3


def check_aux_layers(aux_layers: tuple[int, ...], num_layers: int) -> None:
    if len(aux_layers) != 3 or any(not 0 <= i < num_layers for i in aux_layers) or sorted(set(aux_layers)) != list(aux_layers):
        raise InvalidArgumentError(
            f"an EAGLE-3 head reads three target layers, low to high, with indices in 0..{num_layers - 1} "
            f"(the hidden states entering them); got {list(aux_layers)}"
        )


class DraftHead(Stack):
    """What both head types share: the frozen target tensors, the draft vocabulary, the unrolled
    chain forward that drafting, training and evaluation run."""

    head_type = ""
    reads: tuple[int, ...] = ()  # target layers whose input hidden states the head reads; (): f
    input_variant = "feature+shifted-token"

    drafts_with_target_lm = True  # its logits are the target's LM head's (EAGLE-1, Medusa); else its own

    def __init__(self, config: ModelConfig, num_layers: int, layer: type[nn.Module] = Layer,
                 intermediate_size: int | None = None):
        super().__init__(config.for_head(intermediate_size), num_layers, layer)
        self.draft_vocab: Tensor | None = None  # [N] target ids, None for the full vocabulary
        self.embed_weight: Tensor | None = None  # frozen, the target's
        self.target_lm: Tensor | None = None  # frozen: the target's LM head rows of the draft vocabulary
        self.lm_packed: tuple[str, Tensor] | None = None  # target_lm pre-packed (see `pack_weight`)
        self.lm_quantized: QuantizedLinear | None = None  # or quantized (see `quantize_weights`)

    def attach(self, target: Decoder, draft_vocab: Tensor | None = None) -> DraftHead:
        """Share the target's frozen embedding and LM head (sliced to the draft vocabulary)."""
        self.embed_weight = target.embed.weight.detach()
        lm = target.lm_head.weight.detach().to(target.weight_like.dtype)  # (a quantized LM head dequantized once)
        self.draft_vocab = None if draft_vocab is None else draft_vocab.to(lm.device, torch.long)
        self.target_lm = lm if draft_vocab is None else lm[self.draft_vocab].contiguous()
        self.lm_packed = self.lm_quantized = None
        return self

    @property
    def vocab_size(self) -> int:
        return self.target_lm.shape[0]

    def to_target(self, draft_ids: Tensor) -> Tensor:
        return draft_ids if self.draft_vocab is None else self.draft_vocab[draft_ids]

    def target_logits(self, features: Tensor) -> Tensor:
        """The target's logits over the draft vocabulary [..., N] from its final features [..., H]."""
        return F.linear(features, self.target_lm.to(features.dtype))

    def embed(self, tokens: Tensor, dtype: torch.dtype) -> Tensor:
        return F.embedding(tokens, self.embed_weight).to(dtype)

    def lift(self, target_outputs: Tensor) -> Tensor:
        """What the target gives at committed positions [..., F] -> the head's hidden space [..., H]."""
        return target_outputs

    def quantize_weights(self) -> None:
        """For inference beside a quantized target: the head's matrices in int8 (`quantize.py`),
        read in half the bytes of bf16 and multiplied by the same kernels as the target's. The
        head's rounding changes which tokens it proposes, never what verification outputs."""
        quantize(self, "int8", self.weight_like.dtype)
        if self.drafts_with_target_lm:
            lm = nn.Linear(self.target_lm.shape[1], self.target_lm.shape[0], bias=False, device="meta")
            lm.weight = nn.Parameter(self.target_lm, requires_grad=False)
            self.lm_quantized = QuantizedLinear(lm, "int8")

    def pack_weights(self) -> bool:
        """Pre-pack the head's and the sliced LM head's weights where exact (bf16 on CPU)."""
        if not super().pack_weights():
            return False
        if self.drafts_with_target_lm:
            self.lm_packed = pack_weight(self.target_lm)
        return True

    def logits(self, hidden: Tensor) -> Tensor:
        """Draft logits over the draft vocabulary [..., N] (index with `to_target` for target ids):
        the target's LM head on the predicted hidden state, a row's the same whatever rows the call
        carries (the rows drafting together, head_rows.py)."""
        if self.lm_quantized is not None:
            return self.lm_quantized(hidden)
        if self.lm_packed is not None and hidden.dtype == self.target_lm.dtype and plain_cpu(hidden):
            return packed_linear(hidden, self.lm_packed, None, len(self.target_lm))
        return invariant_linear(hidden, self.target_lm.to(hidden.dtype), None)

    def unroll(self, target_outputs: Tensor, tokens: Tensor, depth: int, cache: KVCache) -> list[Tensor]:
        """Chains drafted from every position j at once, as chain drafting runs them.

        target_outputs [L, F]: what the target gives at positions 0..L-1 (`reads`); tokens [L]:
        the token each position reads beside it (t[j+1]). Step 0 predicts from the true inputs;
        step k reads the hidden state its chain predicted at step k-1 and the true token
        t[j+k+1], at position j+k, attending to the true entries up to j and its chain's own
        earlier steps. Returns per step k = 0..depth the predicted hidden states [L - k, H] of the
        chains j = 0..L-1-k (fewer steps when L is short). `cache` must hold sum(L - k) entries.
        """
        L = len(tokens)
        steps = [self(self.lift(target_outputs)[None], tokens[None], cache)[0]]
        bases = []
        for k in range(1, depth + 1):
            n = L - k
            if n <= 0:
                break
            bases.append(cache.length)
            j = torch.arange(n, device=tokens.device)
            mask = torch.zeros(n, cache.length + n, dtype=torch.bool, device=tokens.device)
            mask[:, :L] = torch.arange(L, device=tokens.device)[None, :] <= j[:, None]  # true entries up to j
            for base in bases:
                mask[j, base + j] = True  # the chain's own earlier steps, and itself
            steps.append(self(steps[-1][None, :n], tokens[None, k:k + n], cache, positions=(j + k)[None], mask=mask)[0])
        return steps


class EagleHead(DraftHead):
    head_type = "eagle1"

    def __init__(self, config: ModelConfig, num_layers: int = 1,
                 input_variant: str = "feature+shifted-token", intermediate_size: int | None = None):
        if input_variant not in INPUT_VARIANTS:
            raise InvalidArgumentError(f"input variant must be one of {', '.join(INPUT_VARIANTS)}, got '{input_variant}'")
        super().__init__(config, num_layers, intermediate_size=intermediate_size)
        self.input_variant = input_variant
        self.fc = Linear(2 * config.hidden_size, config.hidden_size, bias=True)
        self.layers[0].input_norm = nn.Identity()

    def inputs(self, features: Tensor, tokens: Tensor) -> Tensor:
        """fc input [B, T, 2H] = concat(embedding, feature), parts zeroed by the input variant.

        `tokens` are the ones the variant reads: t[j+1] for the shifted variants, t[j] for unshifted.
        """
        embedded = self.embed(tokens, features.dtype)
        if self.input_variant == "feature":
            embedded = torch.zeros_like(embedded)
        elif self.input_variant == "token":
            features = torch.zeros_like(features)
        return torch.cat((embedded, features), dim=-1)

    def forward(self, features: Tensor, tokens: Tensor, cache: KVCache, positions: Tensor | None = None,
                mask: Tensor | None = None) -> Tensor:
        """Predicted next features [B, T, H] from features [B, T, H] and tokens [B, T] (see `inputs`)."""
        return self.run_layers(self.fc(self.inputs(features, tokens)), cache, positions, mask)[0]

    def init_from_target(self, target: Decoder) -> None:
        """Start near "repeat the last layer": fc passes the feature through, and the layer is a
        copy of the target's last decoder layer (DESIGN.md's idea for short CPU runs)."""
        h = self.config.hidden_size
        with torch.no_grad():
            self.fc.weight.zero_()
            self.fc.weight[:, h:] = torch.eye(h)
            self.fc.bias.zero_()
            source = target.layers[-1].state_dict()
            for layer in self.layers:
                own = layer.state_dict()
                layer.load_state_dict({k: source[k].to(v.dtype) for k, v in own.items()}, strict=True)


class Eagle3Layer(nn.Module):
    """EAGLE-3's decoder layer: input x = concat(embedding, hidden) [B, T, 2H]; attention reads
    both normalized, the residual stream is the hidden part."""

    def __init__(self, c: ModelConfig, index: int = 0):
        super().__init__()
        self.windowed = c.windowed(index)
        self.input_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.attn = Attention(c, in_features=2 * c.hidden_size)
        self.post_attn_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor,
                start: int, mask: Tensor | None) -> Tensor:
        embedded, hidden = x.chunk(2, dim=-1)
        both = torch.cat((self.input_norm(embedded), self.hidden_norm(hidden)), dim=-1)
        hidden = hidden + self.attn(both, cos, sin, k_cache, v_cache, start, mask)
        return hidden + self.mlp(self.post_attn_norm(hidden))


class Eagle3Head(DraftHead):
    head_type = "eagle3"
    drafts_with_target_lm = False

    def __init__(self, config: ModelConfig, aux_layers: tuple[int, ...], draft_vocab_size: int,
                 intermediate_size: int | None = None):
        check_aux_layers(tuple(aux_layers), config.num_layers)
        super().__init__(config, 1, Eagle3Layer, intermediate_size)
        self.reads = tuple(aux_layers)
        h = config.hidden_size
        self.fc = Linear(3 * h, h, bias=False)
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.lm_head = Linear(h, draft_vocab_size, bias=False)

    def attach(self, target: Decoder, draft_vocab: Tensor | None = None) -> Eagle3Head:
        super().attach(target, draft_vocab)
        if self.target_lm.shape[0] != self.lm_head.weight.shape[0]:
            raise InvalidArgumentError(
                f"this EAGLE-3 head drafts over {self.lm_head.weight.shape[0]} tokens but its draft "
                f"vocabulary has {self.target_lm.shape[0]}"
            )
        return self

    def init_from_target(self, target: Decoder) -> None:
        """Its LM head starts as the target's rows of the draft vocabulary, its norm as the target's."""
        with torch.no_grad():
            self.lm_head.weight.copy_(self.target_lm)
            self.norm.weight.copy_(target.norm.weight)

    def lift(self, target_outputs: Tensor) -> Tensor:
        return self.fc(target_outputs)

    def forward(self, hidden: Tensor, tokens: Tensor, cache: KVCache, positions: Tensor | None = None,
                mask: Tensor | None = None) -> Tensor:
        """Predicted hidden states [B, T, H] from hidden states [B, T, H] and tokens [B, T]."""
        x = torch.cat((self.embed(tokens, hidden.dtype), hidden), dim=-1)
        return self.run_layers(x, cache, positions, mask)[0]

    def logits(self, hidden: Tensor) -> Tensor:
        return self.lm_head(self.norm(hidden))

    @property
    def d2t(self) -> Tensor:
        """EAGLE-3's draft -> target table: target id = draft id + d2t[draft id]."""
        n = self.vocab_size
        ids = torch.arange(n, device=self.target_lm.device)
        return (self.to_target(ids) - ids).to(torch.int64)

    @property
    def t2d(self) -> Tensor:
        """EAGLE-3's target -> draft membership: bool [target vocabulary]."""
        member = torch.zeros(self.config.vocab_size, dtype=torch.bool, device=self.target_lm.device)
        member[self.to_target(torch.arange(self.vocab_size, device=member.device))] = True
        return member


class ResBlock(nn.Module):
    """Medusa's block: x + SiLU(linear(x)), zero-initialized so that a fresh head repeats the
    target's own next-token prediction."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = Linear(hidden_size, hidden_size, bias=True)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: Tensor) -> Tensor:
        return x + F.silu(self.linear(x))


class MedusaHead(DraftHead):
    head_type = "medusa"
    input_variant = "feature"

    def __init__(self, config: ModelConfig, num_heads: int = 4):
        if not 1 <= num_heads <= 16:
            raise InvalidArgumentError(f"a Medusa head has 1 to 16 heads, got {num_heads}")
        super().__init__(config, 0)
        self.heads = nn.ModuleList(ResBlock(config.hidden_size) for _ in range(num_heads))

    @property
    def weight_like(self) -> Tensor:
        return self.heads[0].linear.bias  # (not quantized)

    def new_cache(self, capacity: int, batch: int = 1, dtype: torch.dtype | None = None) -> None:
        return None  # the heads attend to nothing

    def forward(self, features: Tensor) -> Tensor:
        """Hidden states [K, ..., H], head k's at index k - 1, from final features [..., H]."""
        return torch.stack([block(features) for block in self.heads])

    def unroll(self, target_outputs: Tensor, tokens: Tensor, depth: int, cache: None) -> list[Tensor]:
        """As `DraftHead.unroll`'s steps: per head k = 1..min(K, depth + 1), the hidden states
        [L - k + 1, H] predicted from f[0..L-k] (head k at j predicts what the target gives at j + k)."""
        L = len(target_outputs)
        return [block(target_outputs[:L - k]) for k, block in enumerate(self.heads[:depth + 1]) if L - k > 0]

    def init_from_target(self, target: Decoder) -> None:
        pass  # zero blocks: every head starts as the target's own prediction


def make_head(config: ModelConfig, head_type: str = "eagle1", *, num_layers: int = 1,
              input_variant: str = "feature+shifted-token", aux_layers: tuple[int, ...] | None = None,
              draft_vocab_size: int | None = None, medusa_heads: int = 4,
              intermediate_size: int | None = None) -> DraftHead:
    """A fresh head of a type (`eagle1`, `eagle3` or `medusa`), checking the options that type takes
    (`intermediate_size`: the MLP width of an EAGLE head's layer; None: the target's)."""
    if head_type == "eagle1":
        if aux_layers:
            raise InvalidArgumentError("aux layers are for EAGLE-3 heads; an EAGLE-1 head reads the final feature")
        return EagleHead(config, num_layers, input_variant, intermediate_size)
    if head_type == "eagle3":
        if num_layers != 1 or input_variant != "feature+shifted-token":
            raise InvalidArgumentError("an EAGLE-3 head has one decoder layer and reads features + shifted tokens")
        return Eagle3Head(config, aux_layers or default_aux_layers(config.num_layers),
                          draft_vocab_size or config.vocab_size, intermediate_size)
    if head_type == "medusa":
        if num_layers != 1 or input_variant != "feature+shifted-token" or aux_layers:
            raise InvalidArgumentError("a Medusa head reads the final feature alone, through residual blocks: "
                                       "--layers, --input-variant and --aux-layers are EAGLE options")
        return MedusaHead(config, medusa_heads)
    raise InvalidArgumentError(f"unknown head type '{head_type}': use {' or '.join(HEAD_TYPES)}")
