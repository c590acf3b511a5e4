"""A compact decoder for the families of `models/families/` (Llama's layer and its variants) with a static KV cache.

One `forward` takes new tokens with explicit positions and a boolean attention mask over
cache + new tokens, so a whole draft tree verifies in one call. It returns the logits and the
features (the hidden state entering the LM head, after the final norm) of every new token.
After verification, `KVCache.keep` compacts the cache to the accepted path in place.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eaglespec.models import kernels
from eaglespec.models.config import ModelConfig
from eaglespec.models.families.moe import MoE
from eaglespec.models.costs import ForwardCosts
from eaglespec.models.kernels import plain_cpu, row_attention, row_linear
from eaglespec.models.quantize import QuantizedLinear
from eaglespec.models.rope import frequencies
from eaglespec.timing import Clock


class KVCache:
    """Preallocated keys and values of every layer: `k`, `v` are [L, B, kv_heads, capacity, head_dim].

    Slots `[0, length)` hold committed tokens, at positions equal to their slots. A forward
    writes its T new tokens to slots `[length, length + T)` and advances `length`; `keep`
    then selects which of those stay.
    """

    def __init__(self, config: ModelConfig, capacity: int, batch: int = 1,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        shape = (config.num_layers, batch, config.num_kv_heads, capacity, config.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.capacity = capacity
        self.length = 0
        self.written = 0  # how many slots the last forward wrote, ending at `length`

    def slot_positions(self) -> Tensor:
        """The position of the token in each committed slot [length] (here: the slot's index)."""
        return torch.arange(self.length, device=self.k.device)

    def keep(self, indices: list[int]) -> None:
        """Keep an ordered subset of the slots the last forward wrote (e.g. the accepted path)."""
        start = self.length - self.written
        n = len(indices)
        if indices != list(range(n)):  # a prefix needs no move
            src = torch.tensor(indices, device=self.k.device) + start
            self.k[:, :, :, start:start + n] = self.k[:, :, :, src]
            self.v[:, :, :, start:start + n] = self.v[:, :, :, src]
        self.length = start + n
        self.written = n


ROW_ALIGN = 4  # CPU fp32 GEMMs (MKL) give a row the same result for any row count that is a multiple of 4
KERNEL_ROWS = 128  # fp32 forwards up to this many rows (decoding, verification) use our linear kernel


def pad_rows(x: Tensor, rows: int) -> Tensor:
    """x [..., M, K] with zero rows appended up to `rows`."""
    return x if x.shape[-2] == rows else F.pad(x, (0, 0, 0, rows - x.shape[-2]))


def aligned_rows(M: int) -> int:
    return -(-M // ROW_ALIGN) * ROW_ALIGN


class Linear(nn.Linear):
    """nn.Linear whose weight can be pre-packed for oneDNN, and whose rows do not depend on each
    other: a row's result is the same whatever number of rows the call carries, as verification
    needs (tested in test_decoder.py).

    bf16 weights are packed at load (`pack_weight`) for our kernel (`kernels.row_linear_bf16`: one
    fixed-order dot product per output, a tile of weights read once for all rows; with AVX-512 BF16
    as fast as oneDNN's from 1 to 512 rows, with AVX2 alone about 3x faster than torch's, measured),
    or, where it is not built, for oneDNN's. oneDNN's bf16 rows are row-invariant on some CPUs only
    (on AMD Zen 5 they change with the row count once K >= 1536, measured), which is why our kernel
    runs wherever it can. fp32 calls of up to KERNEL_ROWS rows (decoding, verification) run
    our AVX2 kernel (`kernels.row_linear`; faster than MKL at one row, measured); the rest run MKL,
    row-invariant at row counts that are multiples of ROW_ALIGN, so fp32 inputs are padded to one
    (fp32 packing for oneDNN would change the rounding, so fp32 stays unpacked).
    """

    packed: tuple[str, Tensor] | None = None

    def pack(self) -> None:
        self.packed = pack_weight(self.weight)

    def forward(self, x: Tensor) -> Tensor:
        if self.packed is not None and x.dtype == self.weight.dtype and plain_cpu(x):
            return packed_linear(x, self.packed, self.bias, self.out_features)
        return invariant_linear(x, self.weight, self.bias)


def invariant_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """F.linear, with a row's result independent of the other rows for fp32 CPU weights (see `Linear`)."""
    if weight.dtype != torch.float32 or x.device.type != "cpu":
        return F.linear(x, weight, bias)
    rows = x.reshape(-1, x.shape[-1])
    M = rows.shape[0]
    if M <= KERNEL_ROWS and (y := row_linear(rows, weight, bias)) is not None:
        return y.view(*x.shape[:-1], -1)
    if x.dtype == torch.float32 and M % ROW_ALIGN:
        # row-invariant only at row counts that are multiples of ROW_ALIGN (measured)
        return F.linear(pad_rows(rows, aligned_rows(M)), weight, bias)[:M].view(*x.shape[:-1], -1)
    return F.linear(x, weight, bias)


def pack_weight(weight: Tensor) -> tuple[str, Tensor] | None:
    """A bf16 CPU weight [N, K] packed for the fastest exact kernel here: ours ("tiles", on CPUs with
    AVX2) or oneDNN's ("onednn", where ours is not built and oneDNN runs bf16); None where neither runs."""
    if weight.device.type != "cpu" or weight.dtype != torch.bfloat16:
        return None
    if (tiles := kernels.pack_bf16(weight)) is not None:
        return "tiles", tiles
    if torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "onednn", torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1)
    return None


def packed_linear(x: Tensor, packed: tuple[str, Tensor], bias: Tensor | None, out_features: int) -> Tensor:
    """x [..., K] (the weight's dtype) times a weight from `pack_weight`: [..., out_features]."""
    kind, weight = packed
    if kind == "onednn":
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    y = kernels.row_linear_bf16(x.reshape(-1, x.shape[-1]), weight, out_features, bias)
    return y.view(*x.shape[:-1], out_features)


def causal_mask(start: int, T: int, device: torch.device | str = "cpu") -> Tensor:
    """bool [T, start + T]: T new tokens in a row after `start` cached ones."""
    mask = torch.ones(T, start + T, dtype=torch.bool, device=device)
    mask[:, start:] = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    return mask


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        if (y := kernels.rms_norm(x, self.weight, self.eps)) is not None:
            return y
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding, half-split convention, over the first R dimensions of each head (R < D:
    partial rotary; the rest pass). x [B, heads, T, D]; cos, sin [B, 1, T, R]."""
    R = cos.shape[-1]
    if R < x.shape[-1]:
        return torch.cat((rotate(x[..., :R], cos, sin), x[..., R:]), dim=-1)
    half = R // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, c: ModelConfig, in_features: int | None = None):
        """`in_features`: the width q/k/v read (default the hidden size; EAGLE-3's layer reads 2x)."""
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        q_size, kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        self.split = (q_size, kv_size, kv_size)
        self.qkv = Linear(in_features or c.hidden_size, q_size + 2 * kv_size, bias=c.qkv_bias)
        self.o = Linear(q_size, c.hidden_size, bias=c.o_bias)
        self.scale = c.attn_scale if c.attn_scale is not None else c.head_dim ** -0.5
        if c.qk_norm:  # over each head's query and key, before RoPE
            self.q_norm, self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps), RMSNorm(c.head_dim, c.rms_norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor,
                start: int, mask: Tensor | None) -> Tensor:
        B, T, _ = x.shape
        end = start + T
        qkv = self.qkv(x)
        norms = (self.q_norm, self.k_norm) if hasattr(self, "q_norm") else None
        if (q := kernels.rope_store(qkv, cos, sin, k_cache, v_cache, start, self.heads, self.kv_heads,
                                    norms)) is not None:
            return self.o(self._attend(q, k_cache[:, :, :end], v_cache[:, :, :end], mask))
        q, k, v = qkv.split(self.split, dim=-1)
        q, k = q.view(B, T, self.heads, self.head_dim), k.view(B, T, self.kv_heads, self.head_dim)
        if norms is not None:
            q, k = norms[0](q), norms[1](k)
        q = rotate(q.transpose(1, 2), cos, sin)
        k = rotate(k.transpose(1, 2), cos, sin)
        v = v.view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        k_cache[:, :, start:end] = k
        v_cache[:, :, start:end] = v
        if start == 0:
            # The same numbers as the cache's, but not a view of it: the next layer's write to the
            # shared cache tensor would invalidate such a view for autograd (training >1 layer).
            keys, values = k.to(k_cache.dtype), v.to(v_cache.dtype)
        elif k.requires_grad:
            # Training a head unrolled over its own steps: the same numbers again, as fresh tensors
            # (autograd saves them; a later step's cache write would invalidate a view).
            keys = torch.cat((k_cache[:, :, :start], k.to(k_cache.dtype)), dim=2)
            values = torch.cat((v_cache[:, :, :start], v.to(v_cache.dtype)), dim=2)
        else:
            keys, values = k_cache[:, :, :end], v_cache[:, :, :end]
        return self.o(self._attend(q, keys, values, mask))

    def _attend(self, q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None) -> Tensor:
        """q [B, heads, T, D] against the keys and values [B, kv_heads, S, D]: [B, T, heads * D]."""
        B, _, T, D = q.shape
        if mask is None and T > 1:  # prefill of an empty cache: the same call for every method
            y = F.scaled_dot_product_attention(q, keys, values, is_causal=True, scale=self.scale,
                                               enable_gqa=self.heads != self.kv_heads)
        else:
            # Decoding and verification. Fold the query heads sharing a kv head into the query
            # axis: rows (group, t); `mask` comes in grouped already (see `Stack.run_layers`).
            groups = self.heads // self.kv_heads
            # The kernel gives a row the numbers it gets in any other forward (see kernels.py).
            y = row_attention(q.reshape(B, self.kv_heads, groups * T, D), keys, values,
                              mask, self.scale).view(B, self.heads, T, D)
        return y.transpose(1, 2).reshape(B, T, -1)


class MLP(nn.Module):
    """A gated MLP: down(act(gate) * up), the activation SiLU or GELU's tanh form (GeGLU)."""

    def __init__(self, c: ModelConfig, intermediate_size: int | None = None):
        super().__init__()
        inner = intermediate_size or c.intermediate_size
        self.activation = c.activation
        self.gate_up = Linear(c.hidden_size, 2 * inner, bias=False)
        self.down = Linear(inner, c.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate_up = self.gate_up(x)
        if (h := kernels.gated(gate_up, self.activation)) is None:
            gate, up = gate_up.chunk(2, dim=-1)
            h = (F.silu(gate) if self.activation == "silu" else F.gelu(gate, approximate="tanh")) * up
        return self.down(h)


class Experts(nn.Module):
    """A mixture of experts in place of the MLP (see `MoE`). A row's result depends only on that
    row: its router scores, its experts (each a row-invariant MLP over the rows that chose it) and
    their sum, taken in the experts' order, as transformers takes it."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        m = c.moe
        self.top_k, self.normalize = m.top_k, m.normalize
        self.router = Linear(c.hidden_size, m.experts, bias=False)
        self.experts = nn.ModuleList(MLP(c, m.intermediate_size) for _ in range(m.experts))
        if m.shared_intermediate_size:
            self.shared = MLP(c, m.shared_intermediate_size)
            self.shared_gate = Linear(c.hidden_size, 1, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, x.shape[-1])
        weights, chosen = torch.softmax(self.router(rows).float(), dim=-1).topk(self.top_k, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(x.dtype)
        out = torch.zeros_like(rows)
        for e in chosen.unique().tolist():  # ascending
            picked, slot = (chosen == e).nonzero(as_tuple=True)
            out.index_add_(0, picked, self.experts[e](rows[picked]) * weights[picked, slot, None])
        if hasattr(self, "shared"):
            out = out + torch.sigmoid(self.shared_gate(rows)) * self.shared(rows)
        return out.view_as(x)


class Layer(nn.Module):
    def __init__(self, c: ModelConfig, index: int = 0):
        super().__init__()
        self.input_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.attn = Attention(c)
        self.post_attn_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)  # the MLP's input norm
        self.mlp = Experts(c) if c.moe is not None and c.moe.sparse[index] else MLP(c)
        if c.sandwich_norms:  # on the attention's and the MLP's outputs (Gemma)
            self.attn_out_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
            self.mlp_out_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.windowed = c.windowed(index)  # the sliding window limits this layer's attention
        self.local_rope = self.windowed and c.local_rope_theta is not None  # with the local RoPE base

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor,
                start: int, mask: Tensor | None) -> Tensor:
        y = self.attn(self.input_norm(x), cos, sin, k_cache, v_cache, start, mask)
        x = x + (self.attn_out_norm(y) if hasattr(self, "attn_out_norm") else y)
        y = self.mlp(self.post_attn_norm(x))
        return x + (self.mlp_out_norm(y) if hasattr(self, "mlp_out_norm") else y)


class Stack(nn.Module):
    """Decoder layers over a KV cache: what the target model and the EAGLE head share."""

    def __init__(self, config: ModelConfig, num_layers: int, layer: type[nn.Module] = Layer):
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(layer(config, i) for i in range(num_layers))
        self._rope_tables: dict[bool, tuple[Tensor, Tensor]] = {}
        self._layer_stack: tuple[tuple, object] | None = None  # (weights' key, kernels.LayerStack or None)

    @property
    def weight_like(self) -> Tensor:
        """A parameter whose dtype and device the cache and rotary tables follow (a norm's: the
        linears may hold quantized weights, see `quantize.py`)."""
        return self.layers[0].post_attn_norm.weight

    def pack_weights(self) -> bool:
        """Pre-pack every linear weight where that is exact and faster (bf16 on CPUs, see `Linear`)."""
        weight = self.weight_like
        if weight.device.type != "cpu" or weight.dtype != torch.bfloat16:
            return False
        packed = False
        for module in self.modules():
            if isinstance(module, Linear):
                module.pack()
                packed |= module.packed is not None
        self._layer_stack = None  # built again over the packed weights
        return packed

    def new_cache(self, capacity: int, batch: int = 1, dtype: torch.dtype | None = None) -> KVCache:
        c = replace(self.config, num_layers=len(self.layers))
        return KVCache(c, capacity, batch, dtype or self.weight_like.dtype, self.weight_like.device)

    def rope_table(self, local: bool = False) -> tuple[Tensor, Tensor]:
        """cos and sin for every position, [max_positions, rotary dims], in the weights' dtype: the
        config's RoPE, or with `local` the windowed layers' own base (Gemma-3)."""
        weight = self.weight_like
        c = self.config
        table = self._rope_tables.get(local)
        if table is None or table[0].dtype != weight.dtype or len(table[0]) != c.max_position_embeddings:
            theta, scaling = (c.local_rope_theta, ()) if local else (c.rope_theta, c.rope_scaling)
            inv_freq, factor = frequencies(theta, c.rotary_dim or c.head_dim, scaling)
            pos = torch.arange(c.max_position_embeddings, dtype=torch.float32)
            freqs = torch.outer(pos, inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1).to(weight.device)
            table = self._rope_tables[local] = ((emb.cos() * factor).to(weight.dtype), (emb.sin() * factor).to(weight.dtype))
        return table

    def run_layers(self, x: Tensor, cache: KVCache, positions: Tensor | None, mask: Tensor | None,
                   capture: tuple[int, ...] = ()) -> tuple[Tensor, list[Tensor]]:
        """Run hidden states x [B, T, H] of T new tokens through the layers, appending them to the
        cache. Returns the output and the hidden states entering the layers whose indices are in
        `capture` (index len(layers): the last layer's output), in index order.

        positions: [B, T] (default: `cache.length + arange(T)`).
        mask: bool [T, S] or [B, T, S] with S = cache.length + T, True where a new token may
        attend; None means every new token sees the whole cache and the new tokens before it.
        """
        B, T, _ = x.shape
        start = cache.length
        if start + T > cache.capacity:
            raise ValueError(f"cache holds {cache.capacity} tokens; {start + T} requested")
        if positions is None:
            positions = torch.arange(start, start + T, device=x.device).expand(B, T)
        rope = {}
        for local in {getattr(layer, "local_rope", False) for layer in self.layers}:
            cos_table, sin_table = self.rope_table(local)
            rope[local] = cos_table[positions].unsqueeze(1), sin_table[positions].unsqueeze(1)
        if mask is None and T > 1 and start > 0:
            mask = causal_mask(start, T, x.device)
        masks = {False: mask, True: mask}  # by whether the window limits the layer
        window = self.config.sliding_window
        if window is not None and int(positions.max()) >= window:
            masks[True] = self._windowed(mask, positions, cache.slot_positions(), T)
        groups = self.config.num_heads // self.config.num_kv_heads
        for key, m in masks.items():
            if m is not None:
                if m.dim() == 3:
                    m = m.unsqueeze(1)  # [B, 1, T, S]
                masks[key] = m.repeat(*([1] * (m.dim() - 2)), groups, 1)  # rows (group, t), as in Attention
        stack = self.layer_stack() if plain_cpu(x) and x.dtype == cache.k.dtype else None
        if stack is not None:  # the same layers in one C++ call (kernels.LayerStack)
            flat = [None if m is None else m.reshape(-1, *m.shape[-2:]) for m in (masks[False], masks[True])]
            local = rope.get(True, (None, None))
            x, *captured = stack.run(x, *rope.get(False, local), *local, cache.k, cache.v, start, *flat,
                                     list(capture))
        else:
            captured = []
            for i, layer in enumerate(self.layers):
                if i in capture:
                    captured.append(x)
                windowed = getattr(layer, "windowed", False)
                x = layer(x, *rope[getattr(layer, "local_rope", False)], cache.k[i], cache.v[i], start, masks[windowed])
            if len(self.layers) in capture:
                captured.append(x)
        cache.length, cache.written = start + T, T
        return x, captured

    def layer_stack(self):
        """The layers as one C++ `kernels.LayerStack` for CPU inference, built once per set of
        weights; None where the Python layers run: other layer types (an EAGLE-3 head's), no C++
        kernels, or a linear that the stack does not run (see layer_stack.cpp)."""
        key = (self.weight_like.data_ptr(), self.weight_like.dtype, id(self.layers[0]), id(self.layers[0].attn.qkv))
        if self._layer_stack is None or self._layer_stack[0] != key:
            self._layer_stack = key, self._build_layer_stack()
        return self._layer_stack[1]

    def _build_layer_stack(self):

        if self.weight_like.device.type != "cpu" or self.weight_like.dtype not in (torch.float32, torch.bfloat16):
            return None
        norms, flags, attention, mlps = [], [], [], []
        for layer in self.layers:
            if type(layer) is not Layer:
                return None
            if isinstance(layer.input_norm, RMSNorm):
                input_norm = layer.input_norm.weight.detach()
            elif isinstance(layer.input_norm, nn.Identity):  # an EAGLE-1 head's layer: no input norm
                input_norm = None
            else:
                return None
            optional = [getattr(getattr(module, name, None), "weight", None)
                        for module, name in ((layer.attn, "q_norm"), (layer.attn, "k_norm"),
                                             (layer, "attn_out_norm"), (layer, "mlp_out_norm"))]
            norms += [input_norm, layer.post_attn_norm.weight.detach(),
                      *(None if w is None else w.detach() for w in optional)]
            flags += [layer.windowed, layer.local_rope]
            mlp = layer.mlp
            if isinstance(mlp, Experts):  # in decoder.Experts' order
                linears = [mlp.router, *(x for e in mlp.experts for x in (e.gate_up, e.down))]
                if hasattr(mlp, "shared"):
                    linears += [mlp.shared.gate_up, mlp.shared.down, mlp.shared_gate]
            else:
                linears = [mlp.gate_up, mlp.down]
            specs = [self._linear_spec(linear) for linear in (layer.attn.qkv, layer.attn.o, *linears)]
            if None in specs:  # oneDNN-packed or unpacked bf16 weights: the Python layers
                return None
            attention += specs[:2]
            mlps.append(specs[2:])
        c = self.config
        moe = c.moe or MoE(0, 0, 0, False)
        return kernels.layer_stack(norms, flags, attention, mlps, c.num_heads, c.num_kv_heads, c.rms_norm_eps,
                                   self.layers[0].attn.scale, c.activation == "gelu_tanh", moe.experts, moe.top_k,
                                   moe.normalize)

    @staticmethod
    def _linear_spec(linear: nn.Module) -> tuple | None:
        """A linear as layer_stack.cpp takes it: (kind, weight, scales, bias, out_features); None
        where the stack does not run it."""
        bias = None if linear.bias is None else linear.bias.detach()
        if isinstance(linear, QuantizedLinear):
            spec = (2 if linear.kind == "int4" else 3, linear.packed, linear.scale_offset)
        elif linear.packed is not None and linear.packed[0] == "tiles":
            spec = (0, linear.packed[1], None)
        elif linear.packed is None and linear.weight.dtype == torch.float32:
            spec = (1, linear.weight.detach(), None)
        else:
            return None
        return (*spec, bias, linear.out_features)

    def _windowed(self, mask: Tensor | None, positions: Tensor, cached: Tensor, T: int) -> Tensor:
        """Add the sliding-window limit to a mask (Mistral): a key sits at most window-1 behind.
        `cached`: the positions of the cache's tokens [start] (`KVCache.slot_positions`)."""
        start = len(cached)
        if mask is None:
            mask = causal_mask(start, T, positions.device)
        key_pos = torch.cat((cached.expand(positions.shape[0], start), positions), dim=1)  # [B, S]
        in_window = key_pos[:, None, :] > positions[:, :, None] - self.config.sliding_window
        return mask & in_window


class Decoder(Stack):
    """The target model. Parameters use fused q/k/v and gate/up projections (see `load.py`)."""

    def __init__(self, config: ModelConfig):
        super().__init__(config, config.num_layers)
        c = config
        self.embed = nn.Embedding(c.vocab_size, c.hidden_size)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = Linear(c.hidden_size, c.vocab_size, bias=False)
        self.tie_weights()
        self._forward_costs: ForwardCosts | None = None

    def tie_weights(self) -> None:
        """Share the embedding with the LM head where the config says so (again after loading)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight

    def forward(self, tokens: Tensor, cache: KVCache, positions: Tensor | None = None,
                mask: Tensor | None = None, last_logits_only: bool = False,
                capture: tuple[int, ...] = ()) -> tuple[Tensor, Tensor]:
        """Run T new tokens [B, T] against the cache and append them to it (positions and mask as
        in `Stack.run_layers`). Returns logits [B, T, V] (or [B, 1, V] with `last_logits_only`)
        and features [B, T, H], the hidden states after the final norm; with `capture` (layer
        indices, as in `run_layers`) the features are instead the hidden states entering those
        layers, concatenated [B, T, len(capture) * H] (what an EAGLE-3 head reads)."""
        c = self.config
        x = self.embed(tokens)
        if c.embed_scale:  # Gemma: the scale rounded to the weights' dtype first
            x = x * torch.tensor(c.hidden_size ** 0.5, dtype=x.dtype)
        hidden, captured = self.run_layers(x, cache, positions, mask, capture)
        features = self.norm(hidden)
        logits = self.lm_head(features[:, -1:] if last_logits_only else features)
        if c.logit_softcap is not None:
            logits = torch.tanh(logits / c.logit_softcap) * c.logit_softcap
        return logits, torch.cat(captured, dim=-1) if capture else features

    @torch.inference_mode()
    def forward_costs(self) -> ForwardCosts:
        """Seconds of one forward of n new tokens over 256 cached ones, for n = 0..65 (index n),
        measured once (best of 3 at a few sizes, linear between them). Sizes `auto` draft trees
        (`decoding.sizing`)."""
        if self._forward_costs is None:
            device = self.embed.weight.device
            sizes = (1, 2, 4, 8, 16, 24, 32, 48, 65)
            context = max(min(256, self.config.max_position_embeddings - sizes[-1]), 1)
            cache = self.new_cache(context + sizes[-1])
            # distinct tokens, as a draft tree's are: identical ones would all pick the same experts
            # of a mixture of experts, and measure a fraction of what a tree's tokens read
            ids = torch.randint(self.config.vocab_size, (context + sizes[-1],), generator=torch.Generator().manual_seed(0))
            self(ids[None, :context].to(device), cache, last_logits_only=True)
            measured, clock = [], Clock(device)
            for n in sizes:
                tokens = ids[None, context:context + n].to(device)
                best = float("inf")
                for _ in range(3):
                    clock.lap()
                    self(tokens, cache)
                    best = min(best, clock.lap())
                    cache.keep([])
                measured.append(best)
            costs = [0.0]
            for n in range(1, sizes[-1] + 1):
                i = next(j for j, size in enumerate(sizes) if size >= n)
                lo, hi = (i - 1, i) if i else (0, 0)
                w = 0.0 if lo == hi else (n - sizes[lo]) / (sizes[hi] - sizes[lo])
                costs.append(measured[lo] * (1 - w) + measured[hi] * w)
            self._forward_costs = ForwardCosts(costs)
        return self._forward_costs

