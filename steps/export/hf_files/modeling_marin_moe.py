"""marin-voyage's mixture-of-experts decoder in transformers (shipped with every export as remote
code; `AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)` loads it).

The same function as the training model (steps/moe/model.py in marin-voyage), in fp32 to within
rounding:
- pre-norm blocks with RMSNorm; rotary embeddings (half-split pairs, fp32) on queries and keys;
- grouped-query attention, no biases; "sliding_attention" layers see the last `sliding_window`
  tokens (the current one included), "full_attention" layers the whole causal past;
- every feed-forward is an MoE: an fp32 router scores the experts (sigmoid or softmax); a
  selection bias (`e_score_correction_bias`, the aux-loss-free balancing bias) is added to the
  scores only to choose the top k; the weights are the chosen experts' unbiased scores,
  renormalized to sum to one (`norm_topk_prob`) and times `routed_scaling_factor`;
- the shared experts are one SwiGLU of width n_shared_experts * shared_expert_intermediate_size
  (the same function as that many separate ones summed), added to the routed output;
- untied input and output embeddings.

Shape legend: B batch, S new tokens, L keys (cached and new), D model width, H query heads,
G key/value heads, A head width, R = A/2 rotary frequencies, T = B*S tokens, E routed experts,
K experts per token, V vocabulary.
"""
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .configuration_marin_moe import MarinMoeConfig

RENORM_EPS = 1e-20


class MarinMoeRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rotary_tables(position_ids_BS: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos and sin of the rotary angles at each position, each [B, S, R], in fp32."""
    freq_R = theta ** (-torch.arange(0, head_dim, 2, device=position_ids_BS.device, dtype=torch.float32) / head_dim)
    angle_BSR = position_ids_BS.to(torch.float32)[..., None] * freq_R
    return angle_BSR.cos(), angle_BSR.sin()


def apply_rotary(x_BHSA: Tensor, cos_BSR: Tensor, sin_BSR: Tensor) -> Tensor:
    cos_B1SR, sin_B1SR = cos_BSR[:, None], sin_BSR[:, None]
    x1, x2 = x_BHSA.float().chunk(2, dim=-1)
    out = torch.cat([x1 * cos_B1SR - x2 * sin_B1SR, x1 * sin_B1SR + x2 * cos_B1SR], dim=-1)
    return out.to(x_BHSA.dtype)


def repeat_kv(x_BGLA: Tensor, n_rep: int) -> Tensor:
    """Key/value heads repeated for the query heads that share them: head h reads head h // n_rep."""
    return x_BGLA if n_rep == 1 else x_BGLA.repeat_interleave(n_rep, dim=1)


def eager_attention_forward(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                            attention_mask: Tensor | None, scaling: float, dropout: float = 0.0, **kwargs):
    k_BHLA, v_BHLA = repeat_kv(key, module.num_key_value_groups), repeat_kv(value, module.num_key_value_groups)
    scores_BHSL = torch.matmul(query, k_BHLA.transpose(2, 3)) * scaling
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores_BHSL = scores_BHSL.masked_fill(~attention_mask, float("-inf"))
        else:
            scores_BHSL = scores_BHSL + attention_mask
    probs_BHSL = F.softmax(scores_BHSL, dim=-1, dtype=torch.float32).to(query.dtype)
    probs_BHSL = F.dropout(probs_BHSL, p=dropout, training=module.training)
    return torch.matmul(probs_BHSL, v_BHLA).transpose(1, 2).contiguous(), probs_BHSL


class MarinMoeAttention(nn.Module):
    def __init__(self, config: MarinMoeConfig, layer_idx: int):
        super().__init__()
        self.config, self.layer_idx = config, layer_idx
        self.head_dim = config.head_dim
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = self.head_dim ** -0.5
        self.is_causal = True
        self.sliding_window = config.sliding_window if config.layer_types[layer_idx] == "sliding_attention" else None
        D, A = config.hidden_size, config.head_dim
        self.q_proj = nn.Linear(D, config.num_attention_heads * A, bias=False)
        self.k_proj = nn.Linear(D, config.num_key_value_heads * A, bias=False)
        self.v_proj = nn.Linear(D, config.num_key_value_heads * A, bias=False)
        self.o_proj = nn.Linear(config.num_attention_heads * A, D, bias=False)

    def forward(self, hidden_states: Tensor, position_embeddings: tuple[Tensor, Tensor],
                attention_mask: Tensor | None, past_key_values: Cache | None = None, **kwargs):
        B, S, _ = hidden_states.shape
        q_BHSA = self.q_proj(hidden_states).view(B, S, -1, self.head_dim).transpose(1, 2)
        k_BGSA = self.k_proj(hidden_states).view(B, S, -1, self.head_dim).transpose(1, 2)
        v_BGSA = self.v_proj(hidden_states).view(B, S, -1, self.head_dim).transpose(1, 2)
        cos_BSR, sin_BSR = position_embeddings
        q_BHSA, k_BGSA = apply_rotary(q_BHSA, cos_BSR, sin_BSR), apply_rotary(k_BGSA, cos_BSR, sin_BSR)
        if past_key_values is not None:
            k_BGSA, v_BGSA = past_key_values.update(k_BGSA, v_BGSA, self.layer_idx)
        attention: Callable = eager_attention_forward
        if self.config._attn_implementation != "eager":
            attention = ALL_ATTENTION_FUNCTIONS[self.config._attn_implementation]
        o_BSHA, weights = attention(self, q_BHSA, k_BGSA, v_BGSA, attention_mask,
                                    dropout=self.config.attention_dropout if self.training else 0.0,
                                    scaling=self.scaling, sliding_window=self.sliding_window, **kwargs)
        return self.o_proj(o_BSHA.reshape(B, S, -1).contiguous()), weights


class MarinMoeMLP(nn.Module):
    """A SwiGLU feed-forward: one routed expert, or the shared experts fused into one."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MarinMoeRouter(nn.Module):
    """fp32 router: the top k of score + selection bias; weights from the unbiased scores."""

    def __init__(self, config: MarinMoeConfig):
        super().__init__()
        self.config = config
        self.weight = nn.Parameter(torch.empty(config.n_routed_experts, config.hidden_size))
        self.register_buffer("e_score_correction_bias", torch.zeros(config.n_routed_experts, dtype=torch.float32))

    def forward(self, x_TD: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        cfg = self.config
        logits_TE = x_TD.float() @ self.weight.float().T
        scores_TE = torch.sigmoid(logits_TE) if cfg.scoring_func == "sigmoid" else torch.softmax(logits_TE, dim=-1)
        key_TE = scores_TE + self.e_score_correction_bias.float()
        idx_TK = torch.topk(key_TE, cfg.num_experts_per_tok, dim=-1, sorted=True).indices
        w_TK = scores_TE.gather(-1, idx_TK)
        if cfg.norm_topk_prob:
            w_TK = w_TK / (w_TK.sum(-1, keepdim=True) + RENORM_EPS)
        return w_TK * cfg.routed_scaling_factor, idx_TK, logits_TE


class MarinMoeSparseBlock(nn.Module):
    def __init__(self, config: MarinMoeConfig):
        super().__init__()
        self.gate = MarinMoeRouter(config)
        self.experts = nn.ModuleList(MarinMoeMLP(config.hidden_size, config.moe_intermediate_size)
                                     for _ in range(config.n_routed_experts))
        hidden = config.n_shared_experts * config.shared_expert_intermediate_size
        self.shared_experts = MarinMoeMLP(config.hidden_size, hidden) if hidden else None

    def forward(self, x_BSD: Tensor) -> Tensor:
        x_TD = x_BSD.reshape(-1, x_BSD.shape[-1])
        w_TK, idx_TK, _ = self.gate(x_TD)
        T, K = idx_TK.shape
        # Each token's K expert outputs, summed over k in order (as the training model does).
        y_TKD = x_TD.new_zeros(T, K, x_TD.shape[-1])
        for e in idx_TK.unique().tolist():
            tok, slot = (idx_TK == e).nonzero(as_tuple=True)
            y_TKD[tok, slot] = self.experts[e](x_TD[tok])
        out_TD = (y_TKD * w_TK.to(y_TKD.dtype).unsqueeze(-1)).sum(1)
        if self.shared_experts is not None:
            out_TD = out_TD + self.shared_experts(x_TD)
        return out_TD.view_as(x_BSD)


class MarinMoeDecoderLayer(nn.Module):
    def __init__(self, config: MarinMoeConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = MarinMoeRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = MarinMoeAttention(config, layer_idx)
        self.post_attention_layernorm = MarinMoeRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MarinMoeSparseBlock(config)

    def forward(self, hidden_states: Tensor, attention_mask: Tensor | None, position_embeddings: tuple[Tensor, Tensor],
                past_key_values: Cache | None = None, **kwargs) -> Tensor:
        attn, _ = self.self_attn(self.input_layernorm(hidden_states), position_embeddings, attention_mask,
                                 past_key_values=past_key_values, **kwargs)
        hidden_states = hidden_states + attn
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class MarinMoePreTrainedModel(PreTrainedModel):
    config_class = MarinMoeConfig
    base_model_prefix = "model"
    _no_split_modules = ["MarinMoeDecoderLayer"]
    _skip_keys_device_placement = ["past_key_values"]
    # The router decides in fp32 whatever dtype the rest is loaded in (the bias steps are ~1e-3).
    _keep_in_fp32_modules_strict = ["mlp.gate.weight", "mlp.gate.e_score_correction_bias"]
    _supports_sdpa = True
    _supports_attention_backend = True

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, MarinMoeRouter):
            from transformers import initialization as init

            init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
            init.zeros_(module.e_score_correction_bias)


class MarinMoeModel(MarinMoePreTrainedModel):
    def __init__(self, config: MarinMoeConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(MarinMoeDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = MarinMoeRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_init()

    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                position_ids: Tensor | None = None, past_key_values: Cache | None = None,
                inputs_embeds: Tensor | None = None, use_cache: bool | None = None, **kwargs) -> BaseModelOutputWithPast:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids and inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache(config=self.config)
        if position_ids is None:
            seen = past_key_values.get_seq_length() if past_key_values is not None else 0
            position_ids = (torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + seen).unsqueeze(0)
        masks = attention_mask
        if not isinstance(masks, dict):  # generate() may have built them already
            mask_kwargs = dict(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                               past_key_values=past_key_values, position_ids=position_ids)
            masks = {"full_attention": create_causal_mask(**mask_kwargs)}
            if "sliding_attention" in self.config.layer_types:
                masks["sliding_attention"] = create_sliding_window_causal_mask(**mask_kwargs)
        cos_BSR, sin_BSR = rotary_tables(position_ids.expand(inputs_embeds.shape[0], -1), self.config.head_dim,
                                         self.config.rope_theta)
        hidden_states = inputs_embeds
        for i, layer in enumerate(self.layers):
            hidden_states = layer(hidden_states, masks[self.config.layer_types[i]], (cos_BSR, sin_BSR),
                                  past_key_values=past_key_values, **kwargs)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(hidden_states),
                                       past_key_values=past_key_values if use_cache else None)


class MarinMoeForCausalLM(MarinMoePreTrainedModel, GenerationMixin):
    def __init__(self, config: MarinMoeConfig):
        super().__init__(config)
        self.model = MarinMoeModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                position_ids: Tensor | None = None, past_key_values: Cache | None = None,
                inputs_embeds: Tensor | None = None, labels: Tensor | None = None, use_cache: bool | None = None,
                logits_to_keep: int | Tensor = 0, **kwargs) -> CausalLMOutputWithPast:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs)
        hidden_BSD = out.last_hidden_state
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits_BSV = self.lm_head(hidden_BSD[:, keep, :])
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits_BSV, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(loss=loss, logits=logits_BSV, past_key_values=out.past_key_values)
