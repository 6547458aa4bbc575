// LLM and its output stream. The engine is single-threaded: a mutex lets Python threads share
// an LLM, and the GIL is released while the engine loads, generates or steps a stream.
#include <deque>
#include <mutex>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "core/error.h"
#include "deepinfer/llm.h"

namespace deepinfer::python {

using namespace nb::literals;

namespace {

struct PyLLM {
  explicit PyLLM(const EngineArgs& args) : llm(args) {}
  LLM llm;
  std::mutex mutex;
  // The engine runs one stream at a time and no generate() beside it.
  bool stream_open = false;

  void check_no_stream(const char* call) const {
    if (stream_open) {
      DI_THROW(call, ": a stream of this LLM is still open; iterate it to the end or close() it");
    }
  }
};

std::string item_type(nb::handle value) {
  return nb::cast<std::string>(nb::type_name(value.type()));
}

ChatMessage to_chat_message(nb::handle message, const std::string& path) {
  if (!nb::isinstance<nb::dict>(message)) {
    DI_THROW(path, " must be a dict {'role': ..., 'content': ...}, got ", item_type(message));
  }
  ChatMessage result;
  bool has_role = false;
  for (auto [key, value] : nb::borrow<nb::dict>(message)) {
    const std::string name = nb::isinstance<nb::str>(key) ? nb::cast<std::string>(key) : "";
    std::string* field = name == "role"      ? &result.role
                         : name == "content" ? &result.content
                                             : nullptr;
    if (field == nullptr) {
      DI_THROW(path, ": unknown key ", nb::cast<std::string>(nb::repr(key)),
               " (accepted: role, content)");
    }
    if (name == "content" && value.is_none()) continue;
    if (!nb::isinstance<nb::str>(value)) {
      DI_THROW(path, ".", name, " must be a str, got ", item_type(value));
    }
    *field = nb::cast<std::string>(value);
    has_role = has_role || name == "role";
  }
  if (!has_role) DI_THROW(path, " has no 'role'");
  return result;
}

// One prompt of deepinfer.LLM's normalized batch: a str, a list of token ids, or a
// conversation (a list of message dicts).
Prompt to_prompt(nb::handle prompt, size_t index) {
  const std::string path = concat("prompts[", index, "]");
  if (nb::isinstance<nb::str>(prompt)) return nb::cast<std::string>(prompt);
  if (!nb::isinstance<nb::list>(prompt)) {
    DI_THROW(path, " must be a str, a list of token ids or a list of messages, got ",
             item_type(prompt));
  }
  const auto items = nb::borrow<nb::list>(prompt);
  if (items.size() > 0 && nb::isinstance<nb::dict>(items[0])) {
    Conversation conversation;
    for (size_t i = 0; i < items.size(); ++i) {
      conversation.push_back(to_chat_message(items[i], concat(path, "[", i, "]")));
    }
    return conversation;
  }
  std::vector<int32_t> ids;
  ids.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    int32_t id = 0;
    if (PyBool_Check(items[i].ptr()) || !nb::try_cast<int32_t>(items[i], id)) {
      DI_THROW(path, "[", i, "] must be a token id (an int that fits in 32 bits), got ",
               nb::cast<std::string>(nb::repr(items[i])));
    }
    ids.push_back(id);
  }
  return ids;
}

std::vector<Prompt> to_prompts(const nb::list& prompts) {
  std::vector<Prompt> result;
  result.reserve(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) result.push_back(to_prompt(prompts[i], i));
  return result;
}

ChatOptions chat_options(bool thinking, const std::string& reasoning_effort) {
  ChatOptions options;
  options.thinking = thinking;
  options.reasoning_effort = reasoning_effort;
  return options;
}

// A Python iterator over one OutputStream: yields the deltas one RequestOutput at a time.
class PyOutputStream {
 public:
  PyOutputStream(PyLLM& owner, OutputStream stream) : owner_(&owner), stream_(std::move(stream)) {
    owner_->stream_open = true;
  }
  ~PyOutputStream() { close(); }
  PyOutputStream(const PyOutputStream&) = delete;
  PyOutputStream& operator=(const PyOutputStream&) = delete;

  RequestOutput next() {
    if (pending_.empty() && stream_) {
      std::optional<std::vector<RequestOutput>> deltas;
      {
        nb::gil_scoped_release release;
        std::lock_guard lock(owner_->mutex);
        deltas = stream_->next();
      }
      if (deltas) {
        for (auto& delta : *deltas) pending_.push_back(std::move(delta));
      } else {
        close();
      }
    }
    if (pending_.empty()) throw nb::stop_iteration();
    RequestOutput delta = std::move(pending_.front());
    pending_.pop_front();
    if (delta.error) {
      DI_THROW("prompts[", delta.request_id, "]: ", *delta.error);
    }
    return delta;
  }

  bool abort(const std::string& request_id) {
    if (!stream_) return false;
    std::lock_guard lock(owner_->mutex);
    return stream_->abort(request_id);
  }

  // Destroying the C++ stream aborts what is left (include/deepinfer/llm.h) and frees the LLM.
  void close() {
    if (!stream_) return;
    {
      std::lock_guard lock(owner_->mutex);
      stream_.reset();
    }
    owner_->stream_open = false;
  }

 private:
  PyLLM* owner_;  // kept alive by nb::keep_alive on LLM._stream
  std::optional<OutputStream> stream_;
  std::deque<RequestOutput> pending_;
};

}  // namespace

void bind_llm(nb::module_& module) {
  nb::class_<PyOutputStream>(module, "OutputStream",
                             "Iterator of RequestOutput deltas (LLM.stream()).")
      .def("__iter__", [](nb::handle self) { return nb::borrow(self); })
      .def("__next__", &PyOutputStream::next)
      .def("abort", &PyOutputStream::abort, "request_id"_a,
           "Ends one request of the stream early (finish_reason 'abort').")
      .def("close", &PyOutputStream::close, "Aborts what is left and frees the LLM.")
      .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
      .def("__exit__", [](PyOutputStream& self, nb::args) { self.close(); });

  nb::class_<PyLLM>(module, "LLM", "The C++ LLM; deepinfer.LLM adds vLLM's calls.")
      .def(
          "__init__",
          [](PyLLM* self, const EngineArgs& args) {
            nb::gil_scoped_release release;
            new (self) PyLLM(args);
          },
          "args"_a)
      .def_prop_ro(
          "args", [](PyLLM& self) { return self.llm.args(); }, "The resolved EngineArgs.")
      .def(
          "_generate",
          [](PyLLM& self, const nb::list& prompts, const std::vector<SamplingParams>& params,
             bool thinking, const std::string& reasoning_effort) {
            self.check_no_stream("generate");
            const auto batch = to_prompts(prompts);
            nb::gil_scoped_release release;
            std::lock_guard lock(self.mutex);
            return self.llm.generate(batch, params, chat_options(thinking, reasoning_effort));
          },
          "prompts"_a, "params"_a, "thinking"_a = false, "reasoning_effort"_a = "")
      .def(
          "_stream",
          [](PyLLM& self, const nb::list& prompts, const std::vector<SamplingParams>& params,
             bool thinking, const std::string& reasoning_effort) {
            self.check_no_stream("stream");
            const auto batch = to_prompts(prompts);
            std::optional<OutputStream> stream;
            {
              nb::gil_scoped_release release;
              std::lock_guard lock(self.mutex);
              stream.emplace(
                  self.llm.stream(batch, params, chat_options(thinking, reasoning_effort)));
            }
            return new PyOutputStream(self, std::move(*stream));
          },
          "prompts"_a, "params"_a, "thinking"_a = false, "reasoning_effort"_a = "",
          nb::keep_alive<0, 1>(), nb::rv_policy::take_ownership)
      .def(
          "encode_prompt",
          [](PyLLM& self, nb::handle prompt, bool thinking, const std::string& reasoning_effort) {
            nb::list batch;
            batch.append(prompt);
            const auto prompts = to_prompts(batch);
            std::lock_guard lock(self.mutex);
            return self.llm.encode_prompt(prompts[0], chat_options(thinking, reasoning_effort));
          },
          "prompt"_a, "thinking"_a = false, "reasoning_effort"_a = "",
          "The prompt token ids that a text, token-id or conversation prompt becomes.")
      .def(
          "decode",
          [](PyLLM& self, const std::vector<int32_t>& token_ids, bool skip_special_tokens) {
            std::lock_guard lock(self.mutex);
            return self.llm.decode(token_ids, skip_special_tokens);
          },
          "token_ids"_a, "skip_special_tokens"_a = true,
          "Text of token ids with the model's tokenizer.")
      .def_prop_ro("has_tokenizer", [](PyLLM& self) { return self.llm.has_tokenizer(); });
}

}  // namespace deepinfer::python
