#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <map>

#include "core/error.h"
#include "core/logging.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "engine/state_manager.h"
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
  std::map<std::string, std::unique_ptr<Request>> requests;
  int64_t next_arrival = 0;
  std::vector<float> logits;
  std::optional<StepPlan> planned;  // async: the step planned while the previous one ran
  EngineStats stats;

  void fail(Request& request, std::string message) {
    request.error = std::move(message);
    finish(request, FinishReason::kError);
  }

  void finish(Request& request, FinishReason reason) {
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
    if (params.n != 1) return concat("n = ", params.n, " is not supported yet; use n = 1");
    if (!params.stop.empty()) {
      return std::string("stop strings need a tokenizer, which this engine does not load yet");
    }
    if (params.so_args) return std::string("structured outputs (so_args) are not wired in yet");
    return std::nullopt;
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
      const size_t total = step.tokens.size();
      if (logits.size() < total * static_cast<size_t>(vocab)) {
        logits.resize(total * static_cast<size_t>(vocab));
      }
      runner->forward(step.batch,
                      std::span<float>(logits).first(total * static_cast<size_t>(vocab)));
      // Gather the sampled rows so the sampler sees a dense [rows, vocab] block.
      std::vector<float> sample_logits(step.rows.size() * static_cast<size_t>(vocab));
      for (size_t r = 0; r < step.rows.size(); ++r) {
        std::copy_n(logits.begin() + step.row_of_logits[r] * vocab, vocab,
                    sample_logits.begin() + static_cast<int64_t>(r) * vocab);
      }
      step.results.resize(step.rows.size());
      sampler.sample(sample_logits, vocab, step.rows, step.results);
    } catch (const std::exception& error) {
      step.error = concat("the model step failed: ", error.what());
    }
  }

  void check_stop(Request& request, int32_t token) {
    const auto& params = request.params;
    if (!params.ignore_eos && std::find(eos.begin(), eos.end(), token) != eos.end()) {
      finish(request, FinishReason::kStop);
    } else if (std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), token) !=
               params.stop_token_ids.end()) {
      request.stop_reason = std::to_string(token);
      finish(request, FinishReason::kStop);
    } else if ((params.max_tokens &&
                static_cast<int64_t>(request.output.size()) >= *params.max_tokens) ||
               static_cast<int64_t>(request.prompt.size() + request.output.size()) >=
                   max_model_len) {
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
      if (!result.ok()) {
        fail(request, result.error);
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
    }
    // Requests finished while in flight (abort, forward error) are removed now.
    for (const auto& chunk : step.plan.chunks) {
      Request& request = *chunk.request;
      if (!step.error.empty() && !request.finished()) fail(request, step.error);
      if (request.finished()) scheduler->remove(&request);
    }
  }

  void step_sync() {
    PreparedStep step = prepare(scheduler->schedule());
    if (step.plan.empty()) return;
    execute(step);
    update(step);
  }

  void step_async() {
    if (!planned) planned = scheduler->schedule();
    PreparedStep current = prepare(std::move(*planned));
    planned.reset();
    if (current.plan.empty()) return;
    auto done = std::async(std::launch::async, [&] { execute(current); });
    // Overlap: plan step N+1 while step N runs. Its decode tokens are read at prepare time,
    // after step N's samples have landed.
    std::optional<StepPlan> next;
    try {
      next = scheduler->schedule();
    } catch (...) {
      done.wait();
      throw;
    }
    done.get();
    update(current);
    planned = std::move(next);
  }
};

Engine::Engine(const EngineArgs& args, std::unique_ptr<ModelRunner> runner)
    : impl_(std::make_unique<Impl>()) {
  DI_CHECK(runner != nullptr, "engine without a model runner");
  Impl& s = *impl_;
  s.args = args;
  s.runner = std::move(runner);
  s.vocab = s.runner->vocab_size();
  s.eos = s.runner->eos_token_ids();
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
  s.runner->allocate_slots(args.max_num_seqs, s.max_model_len);
  s.states = std::make_unique<StateManager>(args.max_num_seqs, s.max_model_len, capacity);
  s.scheduler = std::make_unique<Scheduler>(
      SchedulerLimits{args.max_num_seqs, args.max_num_batched_tokens, s.max_model_len}, *s.states);
}

Engine::~Engine() = default;

std::string Engine::add_request(std::vector<int32_t> prompt, const SamplingParams& params,
                                std::optional<std::string> request_id) {
  Impl& s = *impl_;
  auto request = std::make_unique<Request>();
  request->arrival_order = s.next_arrival++;
  request->id = request_id ? *request_id : std::to_string(request->arrival_order);
  if (s.requests.count(request->id)) DI_THROW("request id '", request->id, "' is already in use");
  request->params = params;
  request->seed = params.seq_seed
                      ? *params.seq_seed
                      : mix_seed(s.args.seed ^ static_cast<uint64_t>(request->arrival_order));
  request->timings.arrival_s = now_seconds();
  auto error = s.validate(prompt, params);
  request->prompt = std::move(prompt);
  Request* raw = request.get();
  s.requests.emplace(raw->id, std::move(request));
  s.scheduler->add(raw);
  if (error) s.fail(*raw, "request '" + raw->id + "': " + *error);
  return raw->id;
}

bool Engine::abort(const std::string& request_id) {
  Impl& s = *impl_;
  auto it = s.requests.find(request_id);
  if (it == s.requests.end() || it->second->finished()) return false;
  s.finish(*it->second, FinishReason::kAbort);
  return true;
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
  const Request& request = *it->second;
  RequestOutput out;
  out.request_id = request.id;
  out.prompt_token_ids = request.prompt;
  out.finished = request.finished();
  out.error = request.error;
  out.timings = request.timings;
  CompletionOutput completion;
  completion.token_ids = request.output;
  completion.finish_reason = request.finish_reason;
  completion.stop_reason = request.stop_reason;
  if (request.params.logprobs) completion.logprobs = request.logprobs;
  out.outputs.push_back(std::move(completion));
  return out;
}

void Engine::release(const std::string& request_id) {
  auto it = impl_->requests.find(request_id);
  if (it != impl_->requests.end() && it->second->finished()) impl_->requests.erase(it);
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

}  // namespace deepinfer::engine
