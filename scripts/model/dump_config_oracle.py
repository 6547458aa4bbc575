#!/usr/bin/env python3
"""Dump HF transformers' view of DeepSeek-V4.1 configs: the oracle for tests/model/config_test.cpp.

For every case below, builds HF's DeepseekV41TextConfig (flat) or DeepseekV41Config (composite)
and records either every derived field or the exception HF raises. The C++ parser must derive
the same values and reject the same inputs, naming the same field.

Needs a transformers build that has models/deepseek_v41 (huggingface/transformers main; no PyPI
release up to 5.24.0 ships it). The committed output was produced with
src/transformers/models/deepseek_v41/configuration_deepseek_v41.py at commit f026c8315a27
placed into a transformers 5.24.0 install (it only needs PreTrainedConfig, no torch).

Usage: python scripts/model/dump_config_oracle.py > tests/data/configs/oracle/config_oracle.json
"""

import copy
import dataclasses
import json
import logging
import pathlib
import sys

from transformers.models.deepseek_v41.configuration_deepseek_v41 import (
    DeepseekV41Config,
    DeepseekV41TextConfig,
    DeepseekV41VisionConfig,
)

logging.disable(logging.WARNING)
ROOT = pathlib.Path(__file__).resolve().parents[2]
RELEASED = json.loads((ROOT / "tests/data/configs/deepseek_v41_flash_config.json").read_text())

YARN = {"rope_type": "yarn", "factor": 16, "beta_fast": 32, "beta_slow": 1,
        "original_max_position_embeddings": 65536}


def text_fields(config):
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(DeepseekV41TextConfig)}


def vision_fields(config):
    if config is None:
        return None
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(DeepseekV41VisionConfig)}


def run(kind, config_input):
    try:
        if kind == "text":
            config = DeepseekV41TextConfig(**copy.deepcopy(config_input))
            return {"ok": True, "text": text_fields(config)}
        config = DeepseekV41Config(**copy.deepcopy(config_input))
        return {
            "ok": True,
            "text": text_fields(config.text_config),
            "vision": vision_fields(config.vision_config),
            "image_token_id": config.image_token_id,
            "quantization_config": getattr(config, "quantization_config", None),
        }
    except Exception as error:  # every rejection reason is part of the oracle
        return {"ok": False, "error_type": type(error).__name__, "error": str(error)}


def cases():
    # Derived schedules for layer counts other than the released 40.
    for n in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 16, 21, 39, 40, 41, 43):
        # n = 1..3 scale to a prefix of the released schedule, so HF picks the released sources
        # [2, 8, 14, 20] and rejects them as out of range: recorded either way ("*").
        yield f"default_layers_{n}", "text", {"num_hidden_layers": n}, "*"
    yield "default_layers_6_no_nextn", "text", {"num_hidden_layers": 6, "num_nextn_predict_layers": 0}, None
    yield "hf_tester_tiny", "text", {
        "num_hidden_layers": 5, "compress_ratios": [0, 2, 2, 1, 1], "num_nextn_predict_layers": 0,
        "hidden_size": 64, "head_dim": 32, "qk_rope_head_dim": 8, "q_lora_rank": 32}, None
    yield "ratios_with_all_nextn_entries", "text", {
        "num_hidden_layers": 4, "compress_ratios": [0, 2, 2, 1, 0, 0, 0]}, None
    yield "ratios_with_some_nextn_entries", "text", {
        "num_hidden_layers": 4, "compress_ratios": [0, 2, 2, 1, 0]}, None
    yield "custom_ratios_sources_derived", "text", {
        "num_hidden_layers": 8, "compress_ratios": [0, 2, 2, 4, 4, 1, 1, 2]}, None
    yield "custom_ratios_first_layer_compressed", "text", {
        "num_hidden_layers": 4, "compress_ratios": [1, 1, 2, 2]}, None
    yield "explicit_kv_sources_index_follow", "text", {
        "num_hidden_layers": 8, "compress_ratios": [0, 2, 2, 2, 1, 1, 1, 1], "kv_source_layer_ids": [1, 4]}, None
    yield "reindex_sources", "text", {
        "num_hidden_layers": 8, "compress_ratios": [0, 2, 2, 2, 1, 1, 1, 1], "kv_source_layer_ids": [1, 4],
        "index_source_layer_ids": [1, 4, 6], "candidate_source_layer_id": 4}, None
    yield "candidate_disabled", "text", {"num_hidden_layers": 6, "candidate_source_layer_id": -1}, None
    yield "candidate_negative_other", "text", {"num_hidden_layers": 6, "candidate_source_layer_id": -7}, None
    yield "no_compression_at_all", "text", {
        "num_hidden_layers": 3, "compress_ratios": [0, 0, 0], "num_nextn_predict_layers": 0}, None
    yield "explicit_dspark_targets", "text", {"num_hidden_layers": 6, "dspark_target_layer_ids": [1, 2]}, None
    yield "rope_yarn_compress_only", "text", {"num_hidden_layers": 4, "rope_scaling": dict(YARN)}, None
    yield "rope_yarn_attention_factor_kept", "text", {
        "num_hidden_layers": 4, "rope_scaling": dict(YARN, attention_factor=0.5)}, None
    yield "rope_scaling_legacy_type_key", "text", {
        "num_hidden_layers": 4, "rope_scaling": {"type": "yarn", "factor": 4.0,
                                                 "original_max_position_embeddings": 4096}}, None
    yield "rope_parameters_nested", "text", {
        "num_hidden_layers": 4,
        "rope_parameters": {"main": {"rope_type": "default", "rope_theta": 5000.0},
                            "compress": {"rope_type": "yarn", "rope_theta": 80000.0, "factor": 8.0,
                                         "original_max_position_embeddings": 2048}}}, None
    yield "rope_parameters_nested_without_theta", "text", {
        "num_hidden_layers": 4, "rope_theta": 7000.0,
        "rope_parameters": {"main": {"rope_type": "default"}, "compress": {"rope_type": "default"}}}, None
    yield "rope_parameters_flat_is_ignored", "text", {
        "num_hidden_layers": 4, "rope_parameters": {"rope_type": "yarn", "factor": 2.0,
                                                    "original_max_position_embeddings": 64}}, None
    yield "rope_unknown_type_accepted", "text", {
        "num_hidden_layers": 4, "rope_scaling": {"rope_type": "ntk-by-parts", "factor": 2.0}}, None
    yield "engram_defaults_zero_rows", "text", {"num_hidden_layers": 4, "engram_layer_ids": [1, 2]}, None
    yield "engram_explicit", "text", {
        "num_hidden_layers": 4, "engram_layer_ids": [1], "engram_num_embeddings": [700],
        "engram_vocab_size": 64, "engram_n_heads": 2, "engram_head_dim": 64}, None
    yield "moe_fields", "text", {
        "num_hidden_layers": 4, "scoring_func": "sigmoid", "n_routed_experts": 8, "num_experts_per_tok": 2,
        "routed_scaling_factor": 2.5, "gate_temp": 0.5, "norm_topk_prob": False, "swiglu_limit": 0.0}, None
    yield "unknown_keys_kept", "text", {"num_hidden_layers": 4, "engram_pad_token_id": 2, "foo": [1, 2]}, None
    yield "eos_list", "text", {"num_hidden_layers": 4, "eos_token_id": [1, 7]}, None
    # Composite forms.
    yield "released_composite", "composite", RELEASED, None
    released_no_quant = copy.deepcopy(RELEASED)
    del released_no_quant["quantization_config"]
    yield "released_composite_without_quantization", "composite", released_no_quant, None
    yield "composite_empty", "composite", {}, None
    yield "composite_text_only", "composite", {"text_config": {"num_hidden_layers": 5}}, None
    yield "composite_flat_text_fields", "composite", {
        "model_type": "deepseek_v41_text", "num_hidden_layers": 6, "hidden_size": 128}, None
    yield "composite_flat_tie_embeddings", "composite", {"num_hidden_layers": 4, "tie_word_embeddings": True}, None
    # Rejections: the field the error is about (None: must accept; "*": record whatever HF does).
    yield "reject_ratios_too_short", "text", {"num_hidden_layers": 4, "compress_ratios": [0, 2, 2]}, "compress_ratios"
    yield "reject_ratios_too_long", "text", {
        "num_hidden_layers": 4, "num_nextn_predict_layers": 1, "compress_ratios": [0, 2, 2, 1, 0, 0]}, "compress_ratios"
    yield "reject_kv_source_out_of_range", "text", {"num_hidden_layers": 6, "kv_source_layer_ids": [2, 6]}, "kv_source_layer_ids"
    yield "reject_kv_source_negative", "text", {"num_hidden_layers": 6, "kv_source_layer_ids": [-1, 2]}, "kv_source_layer_ids"
    yield "reject_kv_source_ratio_zero", "text", {"num_hidden_layers": 6, "kv_source_layer_ids": [1, 2]}, "kv_source_layer_ids"
    yield "reject_index_source_ratio_zero", "text", {
        "num_hidden_layers": 2, "compress_ratios": [0, 0], "kv_source_layer_ids": [], "index_source_layer_ids": [1]}, "index_source_layer_ids"
    yield "reject_index_source_before_kv", "text", {
        "num_hidden_layers": 6, "compress_ratios": [0, 2, 2, 2, 1, 1], "kv_source_layer_ids": [2, 4],
        "index_source_layer_ids": [1, 2, 4]}, "index_source_layer_ids"
    yield "reject_index_source_out_of_range", "text", {"num_hidden_layers": 6, "index_source_layer_ids": [2, 9]}, "index_source_layer_ids"
    yield "reject_candidate_not_index_source", "text", {"num_hidden_layers": 4, "candidate_source_layer_id": 1}, "candidate_source_layer_id"
    yield "reject_compressed_layer_without_source", "text", {
        "num_hidden_layers": 1, "compress_ratios": [2], "kv_source_layer_ids": []}, "kv_source_layer_ids"
    yield "reject_engram_rows_mismatch", "text", {
        "num_hidden_layers": 4, "engram_layer_ids": [1, 2], "engram_num_embeddings": [10]}, "engram_num_embeddings"
    yield "reject_yarn_missing_factor", "text", {
        "num_hidden_layers": 4, "rope_scaling": {"rope_type": "yarn", "original_max_position_embeddings": 64}}, "factor"
    yield "reject_yarn_missing_original_max", "text", {
        "num_hidden_layers": 4, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "original_max_position_embeddings"
    yield "reject_negative_layers", "text", {"num_hidden_layers": -1}, "num_hidden_layers"
    yield "reject_zero_layers", "text", {"num_hidden_layers": 0}, "kv_source_layer_ids"
    yield "reject_type_int_as_string", "text", {"vocab_size": "129280"}, "vocab_size"
    yield "reject_type_int_as_float", "text", {"hidden_size": 64.0}, "hidden_size"
    yield "reject_type_int_as_bool", "text", {"hc_mult": True}, "hc_mult"
    yield "reject_type_float_as_int", "text", {"gate_temp": 1}, "gate_temp"
    yield "reject_type_bool_as_int", "text", {"norm_topk_prob": 1}, "norm_topk_prob"
    yield "reject_type_str_as_int", "text", {"scoring_func": 3}, "scoring_func"
    yield "reject_type_list_item", "text", {"num_hidden_layers": 3, "compress_ratios": [0, 2, 1.0]}, "compress_ratios"
    yield "reject_type_null_int", "text", {"n_routed_experts": None}, "n_routed_experts"
    yield "reject_type_rope_theta_string", "text", {"rope_theta": "1e4"}, "rope_theta"
    yield "reject_composite_text_error", "composite", {
        "text_config": {"num_hidden_layers": 4, "candidate_source_layer_id": 1}}, "candidate_source_layer_id"
    yield "reject_vision_type", "composite", {"vision_config": {"hidden_size": "big"}}, "hidden_size"


def main():
    out = []
    for name, kind, config_input, field in cases():
        result = run(kind, config_input)
        if field == "*":
            field = None if result["ok"] else "kv_source_layer_ids"
        expect_reject = field is not None
        if result["ok"] == expect_reject:
            sys.exit(f"case {name}: expected {'rejection' if expect_reject else 'acceptance'}, got {result}")
        # HF indexes `compress_ratios` with an out-of-range id and dies with a bare IndexError;
        # that still is a rejection, and ours names the field.
        if expect_reject and field not in result["error"] and result["error_type"] != "IndexError":
            sys.exit(f"case {name}: HF's error does not name {field}: {result['error']}")
        out.append({"name": name, "kind": kind, "input": config_input, "field": field, "expect": result})
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
