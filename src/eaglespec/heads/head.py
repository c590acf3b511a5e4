"""The EAGLE draft head: fc(concat(embed(t[j+1]), f[j])) -> decoder layer(s) of the target's
family (the first without its input norm, no final norm) -> the target's frozen LM head.

Only `fc` and `layers` are trained and saved. The frozen embedding and LM head are the target's
own tensors, shared, never copied into the checkpoint. With a reduced draft vocabulary the head
proposes only from `draft_vocab` (target ids), through the matching rows of the LM head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eaglespec.errors import InvalidArgumentError
from eaglespec.models.config import ModelConfig
from eaglespec.models.decoder import Decoder, KVCache, Linear, Stack

# What the head reads at position j (paper Fig. 8): feature f[j] and/or a token embedding.
INPUT_VARIANTS = ("feature+shifted-token", "feature+unshifted-token", "feature", "token")


class EagleHead(Stack):
    def __init__(self, config: ModelConfig, num_layers: int = 1,
                 input_variant: str = "feature+shifted-token"):
        if input_variant not in INPUT_VARIANTS:
            raise InvalidArgumentError(f"input variant must be one of {', '.join(INPUT_VARIANTS)}, got '{input_variant}'")
        super().__init__(config, num_layers)
        self.input_variant = input_variant
        self.fc = Linear(2 * config.hidden_size, config.hidden_size, bias=True)
        self.layers[0].input_norm = nn.Identity()
        self.draft_vocab: Tensor | None = None  # [N] target ids, None for the full vocabulary
        self.embed_weight: Tensor | None = None  # frozen, the target's
        self.lm_weight: Tensor | None = None  # frozen: the target's LM head rows of the draft vocabulary
        self.lm_packed: Tensor | None = None  # lm_weight pre-packed for oneDNN (see `Linear`)

    def attach(self, target: Decoder, draft_vocab: Tensor | None = None) -> EagleHead:
        """Share the target's frozen embedding and LM head (sliced to the draft vocabulary)."""
        self.embed_weight = target.embed.weight.detach()
        lm = target.lm_head.weight.detach()
        self.draft_vocab = None if draft_vocab is None else draft_vocab.to(lm.device, torch.long)
        self.lm_weight = lm if draft_vocab is None else lm[self.draft_vocab].contiguous()
        self.lm_packed = None
        return self

    def pack_weights(self) -> bool:
        """Pre-pack the layers' and the sliced LM head's weights where exact (bf16 on CPU)."""
        if not super().pack_weights():
            return False
        self.lm_packed = torch.ops.mkldnn._reorder_linear_weight(self.lm_weight, 1)
        return True

    @property
    def vocab_size(self) -> int:
        return self.lm_weight.shape[0]

    def inputs(self, features: Tensor, tokens: Tensor) -> Tensor:
        """fc input [B, T, 2H] = concat(embedding, feature), parts zeroed by the input variant.

        `tokens` are the ones the variant reads: t[j+1] for the shifted variants, t[j] for unshifted.
        """
        embedded = F.embedding(tokens, self.embed_weight).to(features.dtype)
        if self.input_variant == "feature":
            embedded = torch.zeros_like(embedded)
        elif self.input_variant == "token":
            features = torch.zeros_like(features)
        return torch.cat((embedded, features), dim=-1)

    def forward(self, features: Tensor, tokens: Tensor, cache: KVCache, positions: Tensor | None = None,
                mask: Tensor | None = None) -> Tensor:
        """Predicted next features [B, T, H] from features [B, T, H] and tokens [B, T] (see `inputs`)."""
        return self.run_layers(self.fc(self.inputs(features, tokens)), cache, positions, mask)

    def logits(self, features: Tensor) -> Tensor:
        """Draft logits over the draft vocabulary [..., N] (index with `to_target` for target ids)."""
        if self.lm_packed is not None and features.dtype == self.lm_weight.dtype:
            return torch.ops.mkldnn._linear_pointwise(features, self.lm_packed, None, "none", [], "")
        return F.linear(features, self.lm_weight.to(features.dtype))

    def to_target(self, draft_ids: Tensor) -> Tensor:
        return draft_ids if self.draft_vocab is None else self.draft_vocab[draft_ids]

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
