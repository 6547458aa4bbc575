// `deepinfer forward`: runs token ids through the model and writes every position's logits.
//
//   deepinfer forward --model DIR --tokens FILE --mode prefill|chunked:N|decode --out FILE
//                     [--numerics dense|released] [--engram-token-map FILE]
//                     [--dump-layers FILE] [--device cpu|cuda]
//
// FILE of tokens: one request per line, ids separated by spaces or commas. All requests run
// together as one ragged batch per step: `prefill` runs each whole prompt in one step,
// `chunked:N` feeds every request N tokens per step, `decode` one token per step. The output
// safetensors holds `logits` F32 [total tokens, vocab] (request after request), `cu_seqlens` I64
// [requests + 1] (row offsets) and `tokens` I32 -- the docs/GOLDEN.md format. `--device cuda`
// copies the weights to the first GPU and runs the forward there (a CUDA build only).
#include <charconv>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "core/error.h"
#include "core/logging.h"
#include "io/safetensors_writer.h"
#include "model/deepseek_v41/loader.h"
#include "model/deepseek_v41/model.h"

namespace deepinfer::cli {
namespace {

using deepseek_v41::Model;
using deepseek_v41::Numerics;

std::vector<std::vector<int32_t>> read_token_file(const std::string& path) {
  std::ifstream file(path);
  if (!file) DI_THROW("cannot open token file ", path);
  std::vector<std::vector<int32_t>> requests;
  std::string line;
  for (int line_number = 1; std::getline(file, line); ++line_number) {
    for (char& c : line) {
      if (c == ',' || c == '\t' || c == '\r') c = ' ';
    }
    std::istringstream words(line);
    std::vector<int32_t> ids;
    std::string word;
    while (words >> word) {
      int32_t id = 0;
      const auto [end, error] = std::from_chars(word.data(), word.data() + word.size(), id);
      if (error != std::errc() || end != word.data() + word.size()) {
        DI_THROW(path, ":", line_number, ": '", word, "' is not a token id");
      }
      ids.push_back(id);
    }
    if (!ids.empty()) requests.push_back(std::move(ids));
  }
  if (requests.empty()) DI_THROW("token file ", path, " holds no requests");
  return requests;
}

// Tokens per request per step: 0 = the whole prompt.
int64_t parse_mode(const std::string& mode) {
  if (mode == "prefill") return 0;
  if (mode == "decode") return 1;
  if (mode.rfind("chunked:", 0) == 0) {
    int64_t n = 0;
    const std::string number = mode.substr(8);
    const auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), n);
    if (error == std::errc() && end == number.data() + number.size() && n > 0) return n;
  }
  DI_THROW("--mode must be prefill, decode or chunked:N with N > 0, got '", mode, "'");
}

void run_forward(const std::string& model_dir, const std::string& tokens_path,
                 const std::string& mode, const std::string& out_path,
                 const std::string& numerics_name, const std::string& token_map_path,
                 const std::string& dump_path, const std::string& device_name) {
  const int64_t chunk = parse_mode(mode);
  const Numerics numerics = numerics_name == "released" ? Numerics::kReleased : Numerics::kDense;
  const auto prompts = read_token_file(tokens_path);
  deepseek_v41::LoadedModel loaded = deepseek_v41::load_model(model_dir);
  const deepseek_v41::DeepseekV41TextConfig& config = loaded.config.text;

  std::shared_ptr<deepseek_v41::EngramHasher> hasher;
  if (!config.engram_layer_ids.empty()) {
    std::filesystem::path map_path = token_map_path;
    if (map_path.empty()) map_path = std::filesystem::path(model_dir) / "engram_token_map.json";
    if (!std::filesystem::exists(map_path)) {
      DI_THROW(
          "the model has engram layers, which hash tokenizer-normalized ids: pass "
          "--engram-token-map FILE (a JSON array: compressed id of every token id) or put "
          "engram_token_map.json in ",
          model_dir);
    }
    hasher = std::make_shared<deepseek_v41::EngramHasher>(
        config, deepseek_v41::read_engram_token_map(map_path));
  }
  std::unique_ptr<deepseek_v41::ModelParameters> device_parameters;
  const deepseek_v41::ModelParameters* parameters = loaded.parameters.get();
  if (device_name == "cuda") {
    device_parameters =
        deepseek_v41::copy_parameters(*parameters, ops::allocator_for(Device::cuda(0)));
    parameters = device_parameters.get();
  }
  Model model(config, *parameters, numerics, hasher);

  // Layer dumps need the whole batch in one step, so that the observed rows are the output's.
  std::vector<std::vector<float>> layer_streams(static_cast<size_t>(config.num_hidden_layers));
  if (!dump_path.empty()) {
    if (chunk != 0) DI_THROW("--dump-layers needs --mode prefill (one step for every position)");
    model.set_layer_observer([&](int64_t layer, const TensorView& streams) {
      std::vector<float>& host = layer_streams[static_cast<size_t>(layer)];
      host.resize(static_cast<size_t>(streams.numel()));
      ops::copy(streams, TensorView::contiguous(host.data(), DType::kF32, streams.shape()));
      ops::synchronize(streams.device());
    });
  }
  const int64_t vocab = config.vocab_size;
  const std::vector<float> all_logits = deepseek_v41::run_prompts(model, prompts, chunk);

  // docs/GOLDEN.md format: every position of every request, request after request, plus the
  // row offsets of the requests.
  std::vector<int64_t> cu_seqlens = {0};
  std::vector<int32_t> all_tokens;
  for (size_t i = 0; i < prompts.size(); ++i) {
    all_tokens.insert(all_tokens.end(), prompts[i].begin(), prompts[i].end());
    cu_seqlens.push_back(cu_seqlens.back() + static_cast<int64_t>(prompts[i].size()));
  }
  const int64_t rows = cu_seqlens.back();
  std::vector<SafetensorsEntry> entries = {
      {"logits", DType::kF32, {rows, vocab}, std::as_bytes(std::span<const float>(all_logits))},
      {"cu_seqlens",
       DType::kI64,
       {static_cast<int64_t>(cu_seqlens.size())},
       std::as_bytes(std::span<const int64_t>(cu_seqlens))},
      {"tokens", DType::kI32, {rows}, std::as_bytes(std::span<const int32_t>(all_tokens))}};
  SafetensorsMetadata metadata;
  metadata["mode"] = mode;
  metadata["numerics"] = numerics_name;
  metadata["model"] = model_dir;
  write_safetensors(out_path, entries, metadata);
  if (!dump_path.empty()) {
    std::vector<SafetensorsEntry> layers;
    for (size_t layer = 0; layer < layer_streams.size(); ++layer) {
      layers.push_back({"layer" + std::to_string(layer),
                        DType::kF32,
                        {rows, config.hc_mult * config.hidden_size},
                        std::as_bytes(std::span<const float>(layer_streams[layer]))});
    }
    write_safetensors(dump_path, layers, metadata);
  }
  DI_LOG_INFO("wrote logits of ", prompts.size(), " requests to ", out_path);
}

}  // namespace

void register_forward_command(CLI::App& app) {
  auto* command = app.add_subcommand(
      "forward", "Run token ids through the model and write every position's logits");
  static std::string model_dir, tokens_path, mode = "prefill", out_path, numerics = "dense",
                                             token_map, dump_layers, device = "cpu";
  command->add_option("--model", model_dir, "checkpoint directory (config.json + safetensors)")
      ->required()
      ->check(CLI::ExistingDirectory);
  command->add_option("--tokens", tokens_path, "token ids, one request per line")
      ->required()
      ->check(CLI::ExistingFile);
  command->add_option("--mode", mode, "prefill | chunked:N | decode")
      ->check([](const std::string& value) -> std::string {
        try {
          parse_mode(value);
          return {};
        } catch (const Error& error) {
          return error.what();
        }
      });
  command->add_option("--out", out_path, "output safetensors file")->required();
  command->add_option("--numerics", numerics, "dense (HF) or released (DeepSeek reference)")
      ->check(CLI::IsMember({"dense", "released"}));
  command->add_option("--engram-token-map", token_map,
                      "JSON array mapping token ids to engram compressed ids");
  command->add_option("--dump-layers", dump_layers,
                      "also write every decoder layer's output hc streams (`layerN` "
                      "[tokens, hc_mult * hidden] f32) to this file (prefill only)");
  command->add_option("--device", device, "cpu, or cuda: the weights and the forward on GPU 0")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  command->callback([] {
    run_forward(model_dir, tokens_path, mode, out_path, numerics, token_map, dump_layers, device);
  });
}

}  // namespace deepinfer::cli
