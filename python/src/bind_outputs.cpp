// RequestOutput, CompletionOutput, log-probabilities, timings and FinishReason: read-only views
// of include/deepinfer/outputs.h. finish_reason is a str as in vLLM ("stop", "length", ...,
// None while unfinished); a position's log-probabilities read like vLLM's dict
// {token_id: Logprob}: logprobs[i][token_id].logprob.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "core/error.h"
#include "deepinfer/outputs.h"

namespace deepinfer::python {

using namespace nb::literals;

namespace {

std::optional<std::string> finish_reason_text(FinishReason reason) {
  if (reason == FinishReason::kNone) return std::nullopt;
  return std::string(finish_reason_name(reason));
}

// The sampled token first, then the top-k alternatives, each id once.
std::vector<TokenLogprob> distinct_entries(const PositionLogprobs& position) {
  std::vector<TokenLogprob> entries = {position.sampled};
  for (const auto& entry : position.top) {
    if (entry.token_id != position.sampled.token_id) entries.push_back(entry);
  }
  return entries;
}

const TokenLogprob* find_entry(const PositionLogprobs& position, int32_t token_id) {
  if (position.sampled.token_id == token_id) return &position.sampled;
  for (const auto& entry : position.top) {
    if (entry.token_id == token_id) return &entry;
  }
  return nullptr;
}

}  // namespace

void bind_outputs(nb::module_& module) {
  nb::enum_<FinishReason>(module, "FinishReason", "Why a completion ended.")
      .value("NONE", FinishReason::kNone, "not finished")
      .value("STOP", FinishReason::kStop, "EOS, a stop token or a stop string")
      .value("LENGTH", FinishReason::kLength, "max_tokens or the model's maximum length")
      .value("ABORT", FinishReason::kAbort, "aborted")
      .value("ERROR", FinishReason::kError, "the request failed (RequestOutput.error)");

  nb::class_<TokenLogprob>(module, "Logprob", "A token id and its log-probability.")
      .def_ro("token_id", &TokenLogprob::token_id)
      .def_ro("logprob", &TokenLogprob::logprob)
      .def("__repr__", [](const TokenLogprob& entry) {
        return concat("Logprob(token_id=", entry.token_id, ", logprob=", entry.logprob, ")");
      });

  nb::class_<PositionLogprobs>(
      module, "PositionLogprobs",
      "Log-probabilities at one output position: the sampled token's and the top-k. Reads as "
      "a mapping token_id -> Logprob (the sampled token and the top-k, each once).")
      .def_ro("sampled", &PositionLogprobs::sampled)
      .def_ro("top", &PositionLogprobs::top, "The top-k alternatives, most likely first.")
      .def("__len__",
           [](const PositionLogprobs& position) { return distinct_entries(position).size(); })
      .def("__contains__",
           [](const PositionLogprobs& position, int32_t token_id) {
             return find_entry(position, token_id) != nullptr;
           })
      .def("__getitem__",
           [](const PositionLogprobs& position, int32_t token_id) {
             const TokenLogprob* entry = find_entry(position, token_id);
             if (entry == nullptr) throw nb::key_error(concat(token_id).c_str());
             return *entry;
           })
      .def("keys",
           [](const PositionLogprobs& position) {
             std::vector<int32_t> ids;
             for (const auto& entry : distinct_entries(position)) ids.push_back(entry.token_id);
             return ids;
           })
      .def("values", &distinct_entries)
      .def("items",
           [](const PositionLogprobs& position) {
             nb::list items;
             for (const auto& entry : distinct_entries(position)) {
               items.append(nb::make_tuple(entry.token_id, entry));
             }
             return items;
           })
      .def("__iter__",
           [](const PositionLogprobs& position) {
             nb::list ids;
             for (const auto& entry : distinct_entries(position)) ids.append(entry.token_id);
             return nb::iter(ids);
           })
      .def("__repr__", [](const PositionLogprobs& position) {
        std::string text = "{";
        for (const auto& entry : distinct_entries(position)) {
          text += concat(text.size() > 1 ? ", " : "", entry.token_id, ": ", entry.logprob);
        }
        return text + "}";
      });

  nb::class_<CompletionOutput>(module, "CompletionOutput", "One completion of a request.")
      .def_ro("index", &CompletionOutput::index)
      .def_ro("text", &CompletionOutput::text)
      .def_ro("token_ids", &CompletionOutput::token_ids)
      .def_prop_ro(
          "finish_reason",
          [](const CompletionOutput& output) { return finish_reason_text(output.finish_reason); },
          "'stop', 'length', 'abort', 'error', or None while unfinished.")
      .def_ro("stop_reason", &CompletionOutput::stop_reason,
              "The stop string or stop token that ended it, when finish_reason is 'stop'.")
      .def_ro("logprobs", &CompletionOutput::logprobs,
              "Per output position, when SamplingParams.logprobs is set; else None.")
      .def("finished",
           [](const CompletionOutput& output) {
             return output.finish_reason != FinishReason::kNone;
           })
      .def("__repr__", [](const CompletionOutput& output) {
        return concat("CompletionOutput(index=", output.index,
                      ", text=", nb::cast<std::string>(nb::repr(nb::cast(output.text))),
                      ", token_ids=", nb::cast<std::string>(nb::repr(nb::cast(output.token_ids))),
                      ", finish_reason=", finish_reason_name(output.finish_reason), ")");
      });

  nb::class_<RequestTimings>(module, "RequestTimings",
                             "Per-request times in seconds on the engine's steady clock.")
      .def_ro("arrival_s", &RequestTimings::arrival_s)
      .def_ro("first_token_s", &RequestTimings::first_token_s)
      .def_ro("finished_s", &RequestTimings::finished_s)
      .def_ro("num_preemptions", &RequestTimings::num_preemptions)
      .def_prop_ro("time_to_first_token_s",
                   [](const RequestTimings& t) { return t.first_token_s - t.arrival_s; })
      .def("__repr__", [](const RequestTimings& t) {
        return concat("RequestTimings(arrival_s=", t.arrival_s, ", first_token_s=", t.first_token_s,
                      ", finished_s=", t.finished_s, ", num_preemptions=", t.num_preemptions, ")");
      });

  nb::class_<RequestOutput>(module, "RequestOutput", "What a request produced.")
      .def_ro("request_id", &RequestOutput::request_id)
      .def_ro("prompt_token_ids", &RequestOutput::prompt_token_ids)
      .def_ro("outputs", &RequestOutput::outputs, "One CompletionOutput per SamplingParams.n.")
      .def_ro("finished", &RequestOutput::finished)
      .def_ro("error", &RequestOutput::error, "Why the request failed, or None.")
      .def_ro("timings", &RequestOutput::timings)
      .def("__repr__", [](const RequestOutput& output) {
        return concat("RequestOutput(request_id=", output.request_id, ", prompt_token_ids=",
                      nb::cast<std::string>(nb::repr(nb::cast(output.prompt_token_ids))),
                      ", outputs=", nb::cast<std::string>(nb::repr(nb::cast(output.outputs))),
                      ", finished=", output.finished ? "True" : "False",
                      output.error ? ", error=" + *output.error : std::string(), ")");
      });
}

}  // namespace deepinfer::python
