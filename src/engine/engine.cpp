#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <map>
#include <numeric>

#include "core/error.h"
#include "core/logging.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "engine/state_manager.h"
#include "engine/structured_outputs.h"
#include "ops/batch_invariance.h"
#include "sampling/sampler.h"

namespace deepinfer::engine {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

uint64_t mix_seed(uint64_t value) {  // splitmix64 finaliser
  value += 0x9e3779b97f4a7c15ULL;
  value = (value ^ (value >> 30)) * 0xbf58476d1ce4e5b9ULL;
  value = (value ^ (value >> 27)) * 0x94d049bb133111ebULL;
  return value ^ (value >> 31);
}

// What a step needs at execution time, prepared on the engine thread.
struct PreparedStep {
  StepPlan plan;
  std::vector<int32_t> tokens;
  std::vector<SlotTokens> batch;
  std::vector<int32_t> reset_slots;
  std::vector<sampling::SamplerRow> rows;
  std::vector<int64_t> row_of_logits;  // per sampler row: its logits row
  std::vector<Request*> row_request;
  std::vector<sampling::SampledToken> results;
  std::string error;  // the forward failed: every request of the step fails with it
  // Async: the engine thread computes the structured-output masks while the worker runs the
  // forward; the worker waits for them before sampling.
  std::shared_future<void> masks_ready;
};

// More completions than this in one request is a mistake, not a workload.
constexpr int32_t kMaxCompletions = 256;

// A user request: its n sequences (one per completion).
struct RequestGroup {
  std::vector<std::unique_ptr<Request>> sequences;
};

}  // namespace

struct Engine::Impl {
  EngineArgs args;
  std::unique_ptr<ModelRunner> runner;
  int64_t max_model_len = 0;
  int64_t vocab = 0;
  std::vector<int32_t> eos;
  std::unique_ptr<StateManager> states;
  std::unique_ptr<Scheduler> scheduler;
  sampling::Sampler sampler;
  std::optional<tokenizer::Tokenizer> tokenizer;
  std::shared_ptr<const structured::VocabIndex> vocab_index;  // built on first so_args
  // Model rows past the tokenizer (vocabulary padding) have no token: they must never be
  // sampled (the engram map and the detokenizer know no such id). Empty: no padding.
  std::vector<uint32_t> token_rows_mask;
  std::map<std::string, RequestGroup> requests;
  int64_t next_arrival = 0;
  int64_t plans_made = 0;
  std::vector<float> sample_logits;
  std::optional<StepPlan> planned;  // async: the step planned while the previous one ran
  EngineStats stats;
  StepObserver observer;

  void notify(StepEvent event, int64_t index) const {
    if (observer) observer(event, index);
  }

  StepPlan schedule_next() {
    StepPlan plan = scheduler->schedule();
    plan.index = plans_made++;
    notify(StepEvent::kPlanned, plan.index);
    return plan;
  }

  void fail(Request& request, std::string message) {
    request.error = std::move(message);
    finish(request, FinishReason::kError);
  }

  // `flush_text`: release the detokenizer's pending bytes into the text (not when a stop
  // string has just cut the text).
  void finish(Request& request, FinishReason reason, bool flush_text = true) {
    if (request.finished()) return;
    if (flush_text && request.detokenizer) request.text += request.detokenizer->finish();
    request.finish_reason = reason;
    request.status = RequestStatus::kFinished;
    request.timings.finished_s = now_seconds();
    if (!request.in_flight) scheduler->remove(&request);
  }

  std::optional<std::string> validate(const std::vector<int32_t>& prompt,
                                      const SamplingParams& params) const {
    if (prompt.empty()) return "the prompt is empty: give at least one token";
    if (static_cast<int64_t>(prompt.size()) >= max_model_len) {
      return concat("the prompt has ", prompt.size(), " tokens; max_model_len is ", max_model_len,
                    ", which leaves no room for an output token");
    }
    for (size_t i = 0; i < prompt.size(); ++i) {
      if (prompt[i] < 0 || prompt[i] >= vocab) {
        return concat("prompt token ", i, " is ", prompt[i], ", outside the vocabulary [0, ", vocab,
                      ")");
      }
    }
    try {
      params.validate();
    } catch (const Error& error) {
      return std::string(error.what());
    }
    if (params.n > kMaxCompletions) {
      return concat("invalid sampling params: n must be <= ", kMaxCompletions, ", got ", params.n);
    }
    if (!params.stop.empty() && !tokenizer) {
      return std::string(
          "stop strings need a tokenizer; this engine has none (EngineArgs.tokenizer)");
    }
    if (params.so_args && !tokenizer) {
      return std::string(
          "structured outputs (so_args) need a tokenizer; this engine has none "
          "(EngineArgs.tokenizer)");
    }
    return std::nullopt;
  }

  // Compiles the request's grammar (cached); an error fails the request alone.
  std::optional<structured::CompiledGrammar> compile(const StructuredOutputArgs& so_args,
                                                     std::string& error) {
    try {
      if (!vocab_index) vocab_index = vocab_index_for(*tokenizer, vocab, eos);
      return compile_structured_output(so_args, vocab_index);
    } catch (const std::exception& failure) {
      error = concat("so_args (schema_type '", so_args.schema_type, "'): ", failure.what());
      return std::nullopt;
    }
  }

  // Fills the masks of the rows that have a grammar (engine thread; overlaps the forward in
  // async mode). A failure marks that request alone; update() fails it.
  void compute_masks(PreparedStep& step) {
    for (Request* request : step.row_request) {
      if (!request->matcher) continue;
      try {
        request->matcher->fill_next_token_bitmask(request->allowed_mask);
      } catch (const std::exception& failure) {
        request->mask_error = concat("structured output mask failed: ", failure.what());
      }
    }
    notify(StepEvent::kMasksReady, step.plan.index);
  }

  PreparedStep prepare(StepPlan plan) {
    PreparedStep step;
    // Chunks of requests that finished (or were aborted) after being planned are dropped.
    std::erase_if(plan.chunks, [](const ScheduledChunk& c) { return c.request->finished(); });
    step.plan = std::move(plan);
    size_t total = 0;
    for (const auto& chunk : step.plan.chunks) total += static_cast<size_t>(chunk.num_tokens);
    step.tokens.reserve(total);
    int64_t logits_row = 0;
    for (const auto& chunk : step.plan.chunks) {
      Request& request = *chunk.request;
      DI_CHECK(request.num_computed == chunk.start, "chunk of ", request.id, " starts at ",
               chunk.start, " but the state holds ", request.num_computed);
      if (chunk.fresh_slot) step.reset_slots.push_back(request.slot);
      const size_t begin = step.tokens.size();
      for (int64_t p = chunk.start; p < chunk.start + chunk.num_tokens; ++p) {
        step.tokens.push_back(request.token_at(p));
      }
      step.batch.push_back(
          {request.slot, std::span<const int32_t>(step.tokens)
                             .subspan(begin, static_cast<size_t>(chunk.num_tokens))});
      logits_row += chunk.num_tokens;
      request.in_flight = true;
      if (!chunk.samples) continue;
      sampling::SamplerRow row;
      row.params = &request.params;
      row.seed = request.seed;
      row.sample_index = request.sample_index;
      if (request.matcher) {
        row.allowed_token_bitmask = request.allowed_mask;  // excludes the padding too
      } else if (!token_rows_mask.empty()) {
        row.allowed_token_bitmask = token_rows_mask;
      }
      row.prompt_token_ids = request.prompt;
      row.output_token_ids = request.output;
      row.eos_token_ids = eos;
      step.rows.push_back(row);
      step.row_of_logits.push_back(logits_row - 1);
      step.row_request.push_back(&request);
    }
    return step;
  }

  // Runs on the worker thread in async mode: touches only the runner, the sampler, the
  // logits buffer and `step`.
  void execute(PreparedStep& step) {
    try {
      for (int32_t slot : step.reset_slots) runner->reset_slot(slot);
      // Only the sampled rows leave the model: as the dense [rows, vocab] block the CPU
      // sampler reads, or not at all when the runner samples on its device.
      const bool on_device = runner->samples_on_device();
      sample_logits.resize(on_device ? 0 : step.rows.size() * static_cast<size_t>(vocab));
      notify(StepEvent::kForwardBegin, step.plan.index);
      runner->forward(step.batch, step.row_of_logits, sample_logits);
      notify(StepEvent::kForwardEnd, step.plan.index);
      if (step.masks_ready.valid()) step.masks_ready.wait();
      step.results.resize(step.rows.size());
      if (on_device) {
        runner->sample(step.rows, step.results);
      } else {
        sampler.sample(sample_logits, vocab, step.rows, step.results);
      }
    } catch (const std::exception& error) {
      step.error = concat("the model step failed: ", error.what());
    }
  }

  // The earliest stop string in the text that `added` bytes just extended, if any: only
  // matches that end in the new bytes are new (the rest were checked before). Returns the
  // match position and sets `which`.
  static std::optional<size_t> find_stop_string(const Request& request, size_t added,
                                                const std::string*& which) {
    std::optional<size_t> best;
    const std::string& text = request.text;
    for (const std::string& stop : request.params.stop) {
      const size_t old_size = text.size() - added;
      const size_t from = old_size >= stop.size() - 1 ? old_size - (stop.size() - 1) : 0;
      const size_t at = text.find(stop, from);
      if (at != std::string::npos && (!best || at < *best)) {
        best = at;
        which = &stop;
      }
    }
    return best;
  }

  void check_stop(Request& request, int32_t token) {
    const auto& params = request.params;
    if (!params.ignore_eos && std::find(eos.begin(), eos.end(), token) != eos.end()) {
      finish(request, FinishReason::kStop);  // the EOS token's text is not part of the output
      return;
    }
    if (std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), token) !=
        params.stop_token_ids.end()) {
      request.stop_reason = std::to_string(token);
      finish(request, FinishReason::kStop);
      return;
    }
    if (request.detokenizer) {
      const std::string fresh = request.detokenizer->push(token);
      request.text += fresh;
      // As vLLM: stop strings count once the output is longer than min_tokens.
      if (!fresh.empty() && !params.stop.empty() &&
          static_cast<int64_t>(request.output.size()) > params.min_tokens) {
        const std::string* which = nullptr;
        if (auto at = find_stop_string(request, fresh.size(), which)) {
          request.text.resize(*at);  // the stop string and anything after it are cut
          request.stop_reason = *which;
          finish(request, FinishReason::kStop, /*flush_text=*/false);
          return;
        }
      }
    }
    if ((params.max_tokens && static_cast<int64_t>(request.output.size()) >= *params.max_tokens) ||
        static_cast<int64_t>(request.prompt.size() + request.output.size()) >= max_model_len) {
      finish(request, FinishReason::kLength);
    }
  }

  void update(PreparedStep& step) {
    stats.steps += 1;
    stats.scheduled_tokens += static_cast<int64_t>(step.tokens.size());
    stats.preemptions += static_cast<int64_t>(step.plan.preempted.size());
    stats.max_running =
        std::max<int32_t>(stats.max_running, static_cast<int32_t>(scheduler->running().size()));
    for (const auto& chunk : step.plan.chunks) {
      chunk.request->in_flight = false;
      chunk.request->num_computed += chunk.num_tokens;
      if (chunk.samples) chunk.request->sample_in_flight = false;
    }
    const double now = now_seconds();
    for (size_t r = 0; r < step.row_request.size(); ++r) {
      Request& request = *step.row_request[r];
      if (request.finished()) continue;  // aborted while in flight
      if (!step.error.empty()) {
        fail(request, step.error);
        continue;
      }
      const auto& result = step.results[r];
      if (!request.mask_error.empty()) {
        fail(request, request.mask_error);
        continue;
      }
      if (!result.ok()) {
        fail(request, result.error);
        continue;
      }
      if (request.matcher && !request.matcher->accept_token(result.token_id)) {
        fail(request, concat("structured output: the grammar rejected sampled token ",
                             result.token_id, " (an internal error: the mask allowed it)"));
        continue;
      }
      if (request.output.empty()) request.timings.first_token_s = now;
      request.output.push_back(result.token_id);
      if (request.params.logprobs) {
        PositionLogprobs entry;
        entry.sampled = {result.token_id,
                         result.sampled_logprob ? result.sampled_logprob->logprob : 0.0f};
        for (const auto& top : result.top_logprobs)
          entry.top.push_back({top.token_id, top.logprob});
        request.logprobs.push_back(std::move(entry));
      }
      check_stop(request, result.token_id);
      // A grammar that accepted its stop token is done, even under ignore_eos: nothing may
      // follow a complete document.
      if (request.matcher && request.matcher->is_terminated()) {
        finish(request, FinishReason::kStop);
      }
    }
    // Requests finished while in flight (abort, forward error) are removed now.
    for (const auto& chunk : step.plan.chunks) {
      Request& request = *chunk.request;
      if (!step.error.empty() && !request.finished()) fail(request, step.error);
      if (request.finished()) scheduler->remove(&request);
    }
  }

  void step_sync() {
    PreparedStep step = prepare(schedule_next());
    if (step.plan.empty()) return;
    compute_masks(step);
    execute(step);
    update(step);
  }

  void step_async() {
    if (!planned) planned = schedule_next();
    PreparedStep current = prepare(std::move(*planned));
    planned.reset();
    if (current.plan.empty()) return;
    std::promise<void> masks;
    current.masks_ready = masks.get_future().share();
    auto done = std::async(std::launch::async, [&] { execute(current); });
    // Overlap: while step N's forward runs, compute its grammar masks (they need every token
    // up to N-1, which update N-1 has accepted) and plan step N+1. N+1's decode tokens are
    // read at prepare time, after step N's samples have landed.
    compute_masks(current);
    masks.set_value();
    std::optional<StepPlan> next;
    try {
      next = schedule_next();
    } catch (...) {
      done.wait();
      throw;
    }
    done.get();
    update(current);
    planned = std::move(next);
  }

  Request& new_sequence(RequestGroup& group, const std::string& id, int32_t index,
                        const SamplingParams& params, uint64_t seed,
                        const std::vector<int32_t>& prompt) {
    auto request = std::make_unique<Request>();
    request->arrival_order = next_arrival++;
    request->id = index == 0 ? id : concat(id, "#", index);
    request->params = params;
    request->seed = seed;
    request->sample_index = static_cast<uint32_t>(index);
    request->prompt = prompt;
    request->timings.arrival_s = now_seconds();
    group.sequences.push_back(std::move(request));
    return *group.sequences.back();
  }

  // Output of one sequence: everything, or (delta) what is new since the previous delta.
  CompletionOutput completion_of(Request& request, bool delta) {
    CompletionOutput out;
    out.index = static_cast<int32_t>(request.sample_index);
    size_t first_token = 0;
    size_t first_byte = 0;
    size_t text_end = request.text.size();
    if (delta) {
      first_token = request.delivered_tokens;
      first_byte = request.delivered_text;
      if (!request.finished()) {
        // Hold back what a stop string may still claim; never go back before what was sent.
        text_end =
            std::max(first_byte, text_end > request.stop_holdback ? text_end - request.stop_holdback
                                                                  : size_t{0});
      }
      request.delivered_tokens = request.output.size();
      request.delivered_text = text_end;
      request.delivered_final = request.finished();
    }
    out.text = request.text.substr(first_byte, text_end - first_byte);
    out.token_ids.assign(request.output.begin() + static_cast<std::ptrdiff_t>(first_token),
                         request.output.end());
    if (request.params.logprobs) {
      out.logprobs.emplace(request.logprobs.begin() + static_cast<std::ptrdiff_t>(first_token),
                           request.logprobs.end());
    }
    out.finish_reason = request.finish_reason;
    out.stop_reason = request.stop_reason;
    return out;
  }

  RequestOutput output_of(const std::string& id, RequestGroup& group, bool delta) {
    RequestOutput out;
    out.request_id = id;
    const Request& first = *group.sequences.front();
    out.prompt_token_ids = first.prompt;
    out.finished = true;
    out.timings.arrival_s = first.timings.arrival_s;
    for (auto& sequence : group.sequences) {
      Request& request = *sequence;
      out.finished = out.finished && request.finished();
      if (request.error && !out.error) out.error = request.error;
      const RequestTimings& t = request.timings;
      if (t.first_token_s > 0 &&
          (out.timings.first_token_s == 0 || t.first_token_s < out.timings.first_token_s)) {
        out.timings.first_token_s = t.first_token_s;
      }
      out.timings.finished_s = std::max(out.timings.finished_s, t.finished_s);
      out.timings.num_preemptions += t.num_preemptions;
      if (delta) {
        const bool has_news = request.output.size() > request.delivered_tokens ||
                              (request.finished() && !request.delivered_final);
        if (!has_news) continue;
      }
      out.outputs.push_back(completion_of(request, delta));
    }
    return out;
  }
};

Engine::Engine(const EngineArgs& args, std::unique_ptr<ModelRunner> runner,
               std::optional<tokenizer::Tokenizer> tokenizer)
    : impl_(std::make_unique<Impl>()) {
  DI_CHECK(runner != nullptr, "engine without a model runner");
  Impl& s = *impl_;
  s.args = args;
  // Process-wide (the op layer has no per-engine context): the last engine started decides.
  if (args.batch_invariant) ops::set_batch_invariant(*args.batch_invariant);
  s.tokenizer = std::move(tokenizer);
  s.runner = std::move(runner);
  s.vocab = s.runner->vocab_size();
  s.eos = s.runner->eos_token_ids();
  if (s.tokenizer && s.tokenizer->vocab_size() < s.vocab) {
    s.token_rows_mask.assign(static_cast<size_t>((s.vocab + 31) / 32), 0);
    for (int32_t id = 0; id < s.tokenizer->vocab_size(); ++id) {
      s.token_rows_mask[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
    }
  }
  // State slots are preallocated at max_model_len, so the default stays modest.
  constexpr int64_t kDefaultMaxModelLen = 4096;
  s.max_model_len = args.max_model_len > 0
                        ? args.max_model_len
                        : std::min(kDefaultMaxModelLen, s.runner->max_model_len());
  if (s.max_model_len > s.runner->max_model_len()) {
    DI_THROW("EngineArgs.max_model_len = ", args.max_model_len, " exceeds the model's maximum ",
             s.runner->max_model_len());
  }
  if (args.max_num_seqs <= 0)
    DI_THROW("EngineArgs.max_num_seqs must be > 0, got ", args.max_num_seqs);
  if (args.max_num_batched_tokens <= 0) {
    DI_THROW("EngineArgs.max_num_batched_tokens must be > 0, got ", args.max_num_batched_tokens);
  }
  int64_t capacity = static_cast<int64_t>(args.max_num_seqs) * s.max_model_len;
  if (args.state_pool_bytes == 0) {
    // Every slot is allocated at max_model_len now: they must fit the memory_fraction of what
    // the model's memory has free once the weights are in.
    const int64_t slots_bytes = args.max_num_seqs * s.runner->slot_bytes(s.max_model_len);
    const int64_t free_bytes = s.runner->free_memory();
    const double allowed =
        static_cast<double>(args.memory_fraction) * static_cast<double>(free_bytes);
    if (static_cast<double>(slots_bytes) > allowed) {
      constexpr double kMiB = 1024.0 * 1024.0;
      DI_THROW("the request state slots need ", static_cast<int64_t>(slots_bytes / kMiB),
               " MiB (max_num_seqs ", args.max_num_seqs, " x max_model_len ", s.max_model_len,
               "), more than memory_fraction ", args.memory_fraction, " of the ",
               static_cast<int64_t>(static_cast<double>(free_bytes) / kMiB),
               " MiB free on the model's device: lower max_num_seqs or max_model_len, or raise "
               "memory_fraction");
    }
  }
  if (args.state_pool_bytes > 0) {
    capacity = std::min(
        capacity, args.state_pool_bytes / std::max<int64_t>(1, s.runner->state_bytes_per_token()));
    if (capacity < 2) {
      DI_THROW("EngineArgs.state_pool_bytes = ", args.state_pool_bytes,
               " holds fewer than 2 tokens of state (", s.runner->state_bytes_per_token(),
               " bytes per token)");
    }
  }
  // A request must fit the pool alone, so the oldest one can always run to its end.
  s.max_model_len = std::min(s.max_model_len, capacity);
  s.runner->allocate_slots(args.max_num_seqs, s.max_model_len, args.max_num_batched_tokens);
  s.states = std::make_unique<StateManager>(args.max_num_seqs, s.max_model_len, capacity);
  s.scheduler = std::make_unique<Scheduler>(
      SchedulerLimits{args.max_num_seqs, args.max_num_batched_tokens, s.max_model_len}, *s.states);
}

Engine::~Engine() = default;

std::string Engine::add_request(std::vector<int32_t> prompt, const SamplingParams& params,
                                std::optional<std::string> request_id) {
  Impl& s = *impl_;
  const std::string id = request_id ? *request_id : std::to_string(s.next_arrival);
  if (s.requests.count(id)) DI_THROW("request id '", id, "' is already in use");
  RequestGroup& group = s.requests[id];
  const uint64_t seed = params.seq_seed
                            ? *params.seq_seed
                            : mix_seed(s.args.seed ^ static_cast<uint64_t>(s.next_arrival));
  std::optional<std::string> error = s.validate(prompt, params);
  std::optional<structured::CompiledGrammar> grammar;
  if (!error && params.so_args) {
    std::string compile_error;
    grammar = s.compile(*params.so_args, compile_error);
    if (!grammar) error = std::move(compile_error);
  }
  // An invalid request is one sequence that fails at once, whatever n says.
  const int32_t count = error ? 1 : params.n;
  size_t stop_holdback = 0;
  for (const auto& stop : params.stop) stop_holdback = std::max(stop_holdback, stop.size() - 1);
  for (int32_t index = 0; index < count; ++index) {
    Request& request = s.new_sequence(group, id, index, params, seed, prompt);
    s.scheduler->add(&request);
    if (error) {
      s.fail(request, "request '" + id + "': " + *error);
      continue;
    }
    if (s.tokenizer) {
      request.detokenizer.emplace(*s.tokenizer, params.skip_special_tokens);
      request.stop_holdback = stop_holdback;
    }
    if (grammar) {
      request.matcher = std::make_unique<structured::GrammarMatcher>(*grammar);
      request.allowed_mask.assign(grammar->vocab().mask_words(), 0);
    }
  }
  return id;
}

std::string Engine::add_failed_request(std::vector<int32_t> prompt, const std::string& error,
                                       std::optional<std::string> request_id) {
  Impl& s = *impl_;
  const std::string id = request_id ? *request_id : std::to_string(s.next_arrival);
  if (s.requests.count(id)) DI_THROW("request id '", id, "' is already in use");
  RequestGroup& group = s.requests[id];
  Request& request = s.new_sequence(group, id, 0, SamplingParams{}, 0, prompt);
  s.scheduler->add(&request);
  s.fail(request, "request '" + id + "': " + error);
  return id;
}

bool Engine::abort(const std::string& request_id) {
  Impl& s = *impl_;
  auto it = s.requests.find(request_id);
  if (it == s.requests.end()) return false;
  bool aborted = false;
  for (auto& request : it->second.sequences) {
    if (request->finished()) continue;
    s.finish(*request, FinishReason::kAbort);
    aborted = true;
  }
  return aborted;
}

void Engine::step() {
  if (impl_->args.async_scheduling) {
    impl_->step_async();
  } else {
    impl_->step_sync();
  }
}

bool Engine::has_unfinished() const {
  return impl_->scheduler->has_unfinished();
}

void Engine::run_to_completion() {
  int idle_steps = 0;
  while (has_unfinished()) {
    const int64_t before = impl_->stats.steps;
    step();
    idle_steps = impl_->stats.steps == before ? idle_steps + 1 : 0;
    // Progress is guaranteed (the oldest request can always preempt every newer one and a
    // request fits the pool alone); an idle loop means an internal bug, not a slow request.
    DI_CHECK(idle_steps < 3, "the engine made no progress with ",
             impl_->scheduler->running().size(), " running and ",
             impl_->scheduler->waiting().size(), " waiting requests");
  }
}

RequestOutput Engine::output(const std::string& request_id) const {
  auto it = impl_->requests.find(request_id);
  if (it == impl_->requests.end()) DI_THROW("unknown request id '", request_id, "'");
  return impl_->output_of(request_id, it->second, /*delta=*/false);
}

std::optional<RequestOutput> Engine::take_delta(const std::string& request_id) {
  auto it = impl_->requests.find(request_id);
  if (it == impl_->requests.end()) DI_THROW("unknown request id '", request_id, "'");
  RequestOutput out = impl_->output_of(request_id, it->second, /*delta=*/true);
  if (out.outputs.empty()) return std::nullopt;
  return out;
}

void Engine::release(const std::string& request_id) {
  auto it = impl_->requests.find(request_id);
  if (it == impl_->requests.end()) return;
  for (const auto& request : it->second.sequences) {
    if (!request->finished()) return;
  }
  // The plan made while the last step ran may still name these (finished) requests; it must
  // not outlive them (a later request could reuse their memory).
  if (impl_->planned) {
    std::erase_if(impl_->planned->chunks, [&](const ScheduledChunk& chunk) {
      return std::any_of(it->second.sequences.begin(), it->second.sequences.end(),
                         [&](const auto& request) { return request.get() == chunk.request; });
    });
    std::erase_if(impl_->planned->preempted, [&](const Request* preempted) {
      return std::any_of(it->second.sequences.begin(), it->second.sequences.end(),
                         [&](const auto& request) { return request.get() == preempted; });
    });
  }
  impl_->requests.erase(it);
}

const EngineStats& Engine::stats() const {
  return impl_->stats;
}
int64_t Engine::free_state_tokens() const {
  return impl_->states->free_tokens();
}
int64_t Engine::state_capacity_tokens() const {
  return impl_->states->capacity_tokens();
}
int32_t Engine::free_state_slots() const {
  return impl_->states->free_slots();
}
int32_t Engine::num_state_slots() const {
  return impl_->states->num_slots();
}
int64_t Engine::max_model_len() const {
  return impl_->max_model_len;
}
const std::optional<tokenizer::Tokenizer>& Engine::tokenizer() const {
  return impl_->tokenizer;
}
void Engine::set_step_observer(StepObserver observer) {
  impl_->observer = std::move(observer);
}

}  // namespace deepinfer::engine
