"""The configuration of marin-voyage's MoE decoder in transformers (shipped with every export as
remote code; registered through `auto_map` in config.json).

Field names follow the DeepSeek-V3 / GLM-4.5 MoE configs where the meaning is the same.
`layer_types[i]` is "sliding_attention" (keys within `sliding_window` tokens back, the current one
included) or "full_attention".
"""
from transformers import PretrainedConfig


class MarinMoeConfig(PretrainedConfig):
    model_type = "marin_moe"
    keys_to_ignore_at_inference = ["past_key_values"]

    def __init__(
        self,
        vocab_size: int = 128_256,
        hidden_size: int = 6144,
        num_hidden_layers: int = 48,
        num_attention_heads: int = 48,
        num_key_value_heads: int = 16,
        head_dim: int = 128,
        sliding_window: int | None = 2048,
        layer_types: list[str] | None = None,
        n_routed_experts: int = 384,
        num_experts_per_tok: int = 8,
        moe_intermediate_size: int = 1536,
        n_shared_experts: int = 2,
        shared_expert_intermediate_size: int = 3072,
        scoring_func: str = "sigmoid",
        norm_topk_prob: bool = True,
        routed_scaling_factor: float = 1.0,
        rope_theta: float = 500_000.0,
        rms_norm_eps: float = 1e-5,
        max_position_embeddings: int = 4096,
        initializer_range: float = 0.02,
        hidden_act: str = "silu",
        attention_dropout: float = 0.0,
        use_cache: bool = True,
        tie_word_embeddings: bool = False,
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        pad_token_id: int | None = None,
        **kwargs,
    ):
        if scoring_func not in ("sigmoid", "softmax"):
            raise ValueError(f"scoring_func must be 'sigmoid' or 'softmax', got {scoring_func!r}")
        if tie_word_embeddings:
            raise ValueError("marin_moe has untied input and output embeddings")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.sliding_window = sliding_window
        if layer_types is None:
            layer_types = ["full_attention"] * num_hidden_layers
        if len(layer_types) != num_hidden_layers or not set(layer_types) <= {"sliding_attention", "full_attention"}:
            raise ValueError(f"layer_types must give one of sliding_attention/full_attention per layer, got {layer_types}")
        if "sliding_attention" in layer_types and not sliding_window:
            raise ValueError("sliding_attention layers need a sliding_window")
        self.layer_types = list(layer_types)
        self.n_routed_experts = n_routed_experts
        self.num_experts_per_tok = num_experts_per_tok
        self.moe_intermediate_size = moe_intermediate_size
        self.n_shared_experts = n_shared_experts
        self.shared_expert_intermediate_size = shared_expert_intermediate_size
        self.scoring_func = scoring_func
        self.norm_topk_prob = norm_topk_prob
        self.routed_scaling_factor = routed_scaling_factor
        self.rope_theta = rope_theta
        self.rms_norm_eps = rms_norm_eps
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.hidden_act = hidden_act
        self.attention_dropout = attention_dropout
        self.use_cache = use_cache
        self.tie_word_embeddings = False
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        super().__init__(**kwargs)
