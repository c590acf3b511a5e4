"""Training objectives of a draft head, as weighted terms (`--loss "feature:1,ce:0.1"`).

Per scored position, with p the target's probabilities over the draft vocabulary (the target's
softmax over its whole vocabulary, restricted: the mass outside the draft vocabulary is dropped)
and q the draft's softmax over the draft vocabulary:

    feature  SmoothL1 between the predicted and the target's feature (EAGLE-1's regression;
             EAGLE-1 heads only: an EAGLE-3 head's hidden state is not the target's feature)
    ce       soft cross-entropy -sum_x p(x) log q(x) (EAGLE-1 uses it at weight 0.1; EAGLE-3 alone)
    accept   -log sum_x min(p(x), q(x)): minus the log of the probability that speculative
             sampling accepts a token drawn from q, the quantity verification rewards
    topk     -sum over the target's TOPK most likely tokens of p(x) log q(x): HASS's top-K
             distillation, the cross-entropy on the tokens that decide acceptance
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

TOPK = 10


def position_losses(terms: dict[str, float], draft_logits: Tensor, target_logits: Tensor, target_lse: Tensor,
                    predicted: Tensor, target_features: Tensor) -> Tensor:
    """The weighted loss at each position [n] from draft logits [n, V_draft], the target's logits
    over the draft vocabulary [n, V_draft] with their log-sum-exp over the whole vocabulary [n],
    and the predicted and the target's features [n, H] (read by the feature term only)."""
    log_q = torch.log_softmax(draft_logits.float(), -1)
    p = torch.exp(target_logits.float() - target_lse[:, None])
    loss = torch.zeros(len(log_q), device=log_q.device)
    if terms.get("feature"):
        loss = loss + terms["feature"] * F.smooth_l1_loss(predicted.float(), target_features.float(),
                                                          reduction="none").mean(-1)
    if terms.get("ce"):
        loss = loss + terms["ce"] * -(p * log_q).sum(-1)
    if terms.get("accept"):
        overlap = torch.minimum(p, log_q.exp()).sum(-1)
        loss = loss - terms["accept"] * torch.log(overlap.clamp_min(1e-6))
    if terms.get("topk"):
        top = p.topk(min(TOPK, p.shape[-1]), dim=-1)
        loss = loss + terms["topk"] * -(top.values * log_q.gather(-1, top.indices)).sum(-1)
    return loss
