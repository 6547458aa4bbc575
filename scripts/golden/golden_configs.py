"""The tiny model configurations the golden fixtures cover (see docs/GOLDEN.md for the matrix).

Every entry is a DeepseekV41TextConfig field dict plus the fixture's seed. All shapes keep the
channel counts the reference quantizers need: head_dim a multiple of 32 (FP8 window KV, FP4/16
compressed KV), index_head_dim a multiple of 32 (FP4 indexer q/k), every FP8/FP4 GEMM's K a
multiple of 32.
"""

VOCAB_SIZE = 288  # 3 specials + 256 byte tokens + 29 merges (tokenizer built by generate.py)
REQUEST_LENGTHS = (300, 331)  # every prompt >= 300 tokens; two lengths per fixture

# Weight design that makes the released (FP8-activation) comparison well-posed (docs/GOLDEN.md,
# "Well-posed released comparison"). Measured cause of the misses: an activation element within an
# ulp of an e4m3 midpoint rounds the other way (a 6-12 % step of that element) and (1) flips an MoE
# routing decision whose margin is small, or (2) moves the residual stream by ~0.75 % of a
# branch output, both far above the tolerance (0.1 % of the largest logit).
#  - ROUTING_PIN_BIAS: the noaux_tc selection bias of two experts per layer (the top-k count);
#    selection only, so the routed weights still come from every scoring function's scores, and
#    no routing decision has a margin below ~ROUTING_PIN_BIAS - max score.
#  - BRANCH_GAIN: scales the std of every residual branch's output projection (attention wo_b,
#    expert and shared-expert w2), so one flipped element moves the stream by a small fraction of
#    the tolerance while a semantic error in a branch (O(1) of its output) still moves the logits
#    by tens of tolerances. A power of two: the FP8/FP4 grid and the ue8m0 scales stay exact.
ROUTING_PIN_BIAS = 16.0
BRANCH_GAIN = 2.0**-6

# Per-config overrides of the weight design and the oracles (keys of a CONFIGS entry besides
# `seed` and `config`):
#  - branch_gain:      BRANCH_GAIN unless set
#  - routing_pin_bias: ROUTING_PIN_BIAS unless set; 0 draws the selection bias unpinned
#                      (N(0, 0.1) only), so every token chooses its own experts
#  - dense_only:       True: HF is the only oracle. No reference logits are written, so the golden
#                      test compares the dense path with HF and checks only that the released
#                      path's modes agree (its checkpoint is still written). For fixtures at full
#                      strength (unit branch gain, per-token routing): the dense path vs HF is not
#                      chaotic there, the released path vs the reference is (docs/GOLDEN.md,
#                      "Dense-only fixtures at full strength").

_BASE = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=64,
    q_lora_rank=64,
    qk_rope_head_dim=16,
    o_groups=2,
    o_lora_rank=32,
    rope_theta=10000.0,
    compress_rope_theta=40000.0,
    max_position_embeddings=4096,
    sliding_window=48,
    index_n_heads=16,  # 16 ReLU heads: an entry scoring exactly 0 (all heads <= 0) is rare, so are exact ties
    index_head_dim=32,
    index_topk=12,
    candidate_source_layer_id=-1,
    candidate_topk_blocks=4,
    candidate_block_size=8,
    moe_intermediate_size=32,
    n_routed_experts=6,
    n_shared_experts=1,
    num_experts_per_tok=2,
    scoring_func="sqrtsoftplus",
    gate_temp=1.0,
    norm_topk_prob=True,
    routed_scaling_factor=1.5,
    swiglu_limit=0.0,
    hc_mult=4,
    hc_sinkhorn_iters=20,
    hc_eps=1e-6,
    engram_layer_ids=[],
    engram_vocab_size=1000,
    engram_max_ngram_size=3,
    engram_n_heads=2,
    engram_head_dim=32,
    engram_pad_id=2,
    num_nextn_predict_layers=0,
    rms_norm_eps=1e-20,
    tie_word_embeddings=False,
    bos_token_id=0,
    eos_token_id=1,
    pad_token_id=2,
)

_YARN = {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32, "beta_slow": 1, "original_max_position_embeddings": 64}


def _cfg(**overrides):
    cfg = dict(_BASE)
    cfg.update(overrides)
    return cfg


CONFIGS = {
    # Pure sliding window, window (32) far smaller than the prompt, 2 streams, softmax routing.
    "swa_hc2_softmax": dict(
        seed=101,
        config=_cfg(
            num_hidden_layers=3,
            compress_ratios=[0, 0, 0],
            kv_source_layer_ids=[],
            index_source_layer_ids=[],
            sliding_window=32,
            hc_mult=2,
            scoring_func="softmax",
        ),
    ),
    # Ratio-2 encoder groups (partial last group: both prompt lengths... 331 is odd), one KV source
    # reused by three layers, a Reindex source, engram on two layers, YaRN on the compress rope.
    "r2_engram_reindex": dict(
        seed=202,
        config=_cfg(
            num_hidden_layers=4,
            compress_ratios=[0, 2, 2, 2],
            kv_source_layer_ids=[1],
            index_source_layer_ids=[1, 3],
            engram_layer_ids=[0, 2],
            rope_scaling=_YARN,
        ),
    ),
    # The released shape in miniature: SWA, ratio-2 encoder, ratio-1 decoder with its own KV
    # source, Reindex decoder sources constrained by the two-level candidate top-k, engram.
    "ced_candidates_engram": dict(
        seed=303,
        # 7 layers, 5 of them compressed with indexer and candidate selections: at BRANCH_GAIN the
        # released oracle drifted by 0.78-2.0 tolerances on every seed that reached that check
        # (about a dozen of 32 tried), above the 0.5 acceptance; half the gain halves the drift.
        branch_gain=BRANCH_GAIN / 2,
        config=_cfg(
            num_hidden_layers=7,
            compress_ratios=[0, 2, 2, 1, 1, 1, 1],
            kv_source_layer_ids=[1, 3],
            index_source_layer_ids=[1, 3, 5],
            candidate_source_layer_id=3,
            engram_layer_ids=[1, 4],
            rope_scaling=_YARN,
            swiglu_limit=0.25,
        ),
    ),
    # Ratio-1 only (every token its own compressed entry), candidates on, 2 streams, sigmoid
    # routing, no engram.
    "r1_candidates_hc2_sigmoid": dict(
        seed=404,
        config=_cfg(
            num_hidden_layers=4,
            compress_ratios=[1, 1, 1, 1],
            kv_source_layer_ids=[0],
            index_source_layer_ids=[0, 2],
            candidate_source_layer_id=0,
            hc_mult=2,
            scoring_func="sigmoid",
            index_topk=16,
        ),
    ),
    # Ratio 2 without candidates, softmax routing with gate temperature, engram with 4-grams,
    # window wider than a chunk but smaller than the prompt.
    "r2_softmax_engram4": dict(
        seed=505,
        config=_cfg(
            num_hidden_layers=3,
            compress_ratios=[2, 2, 0],
            kv_source_layer_ids=[0],
            index_source_layer_ids=[0],
            scoring_func="softmax",
            gate_temp=0.7,
            engram_layer_ids=[1],
            engram_max_ngram_size=4,
            sliding_window=64,
            index_topk=20,
        ),
    ),
    # Everything at once with two KV-source groups of different ratios and no candidates.
    "mixed_no_candidates": dict(
        seed=606,
        config=_cfg(
            num_hidden_layers=6,
            compress_ratios=[0, 2, 2, 1, 1, 0],
            kv_source_layer_ids=[1, 3],
            index_source_layer_ids=[1, 3],
            engram_layer_ids=[0],
            swiglu_limit=0.3,
            routed_scaling_factor=2.0,
        ),
    ),
    # Dense-only, full strength (unit branch gain, per-token routing): ratio-1 decoder with
    # candidates, 2 streams, sigmoid scoring.
    # Selections are kept few so that every one can have the backend margin the acceptance
    # requires (generate.py, TopkTieDetector.BACKEND_MARGIN_RELATIVE): the indexer picks 300
    # entries, so it selects only from position 300 of the 331-token request on (index_topk <
    # visible groups there), and 38 candidate blocks of 8 (304 entries) select only from 305
    # visible entries on; layers 2-3 then pick 300 of their <= 304 candidate entries. Before
    # (index_topk 16, 4 blocks) there were ~1800 indexer/candidate selections per run and the
    # smallest relative margin was ~2e-5 on every seed.
    "dense_full_r1_candidates_hc2_sigmoid": dict(
        seed=707,
        branch_gain=1.0,
        routing_pin_bias=0.0,
        dense_only=True,
        config=_cfg(
            num_hidden_layers=4,
            compress_ratios=[0, 1, 1, 1],
            kv_source_layer_ids=[1],
            index_source_layer_ids=[1, 3],
            candidate_source_layer_id=1,
            hc_mult=2,
            scoring_func="sigmoid",
            index_topk=300,
            candidate_topk_blocks=38,
            swiglu_limit=0.25,
        ),
    ),
    # Dense-only, full strength: two KV-source groups of different ratios, engram (3-grams) on two
    # layers, 4 streams, softmax scoring with gate temperature, YaRN on the compress rope.
    # index_topk 300 for the backend margin (as above): the ratio-1 layers select from position
    # 300 on, the ratio-2 layers (<= 165 groups) take every visible group.
    "dense_full_mixed_engram_hc4": dict(
        seed=808,
        branch_gain=1.0,
        routing_pin_bias=0.0,
        dense_only=True,
        config=_cfg(
            num_hidden_layers=5,
            compress_ratios=[0, 2, 2, 1, 1],
            kv_source_layer_ids=[1, 3],
            index_source_layer_ids=[1, 3],
            engram_layer_ids=[0, 3],
            scoring_func="softmax",
            gate_temp=0.7,
            rope_scaling=_YARN,
            routed_scaling_factor=2.0,
            index_topk=300,
        ),
    ),
}
