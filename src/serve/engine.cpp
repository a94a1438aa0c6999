// The generation worker: one thread owns the model Session and runs requests one at a time
// in arrival order (prefill in pieces of the session's batch size, then decode step by step);
// HTTP threads wait on their job. A fresh cache per request and fixed-order kernels make a
// greedy answer the same whatever else is queued.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "serve/internal.h"
#include "util/util.h"

namespace kvaudit::serve {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The row's log-softmax (numerics::log_softmax) into `out`.
void log_softmax(const float* logits, int64_t n, std::vector<float>& out) {
  out.resize(n);
  numerics::log_softmax({logits, static_cast<size_t>(n)}, out);
}

// The k most likely tokens, best first, ties to the lower id; NaN entries never rank.
std::vector<TopLogprob> top_k(const std::vector<float>& log_probs, int k) {
  std::vector<int32_t> ids(log_probs.size());
  std::iota(ids.begin(), ids.end(), 0);
  auto better = [&](int32_t a, int32_t b) {
    float la = log_probs[a], lb = log_probs[b];
    if (std::isnan(la) != std::isnan(lb)) return std::isnan(lb);
    if (la != lb) return la > lb;
    return a < b;
  };
  k = std::min<int>(k, static_cast<int>(ids.size()));
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), better);
  std::vector<TopLogprob> out;
  out.reserve(static_cast<size_t>(k));
  for (int i = 0; i < k; ++i) out.push_back({ids[i], log_probs[ids[i]]});
  return out;
}

TokenLogprobs logprobs_of(const std::vector<float>& log_probs, int32_t token, int top) {
  TokenLogprobs entry;
  entry.token = token;
  entry.logprob = log_probs[token];
  if (top > 0) entry.top = top_k(log_probs, top);
  return entry;
}

}  // namespace

size_t streamable_prefix(std::string_view text, const std::vector<std::string>& stop) {
  // The decoder turns an incomplete trailing character into one U+FFFD (maximal subpart);
  // holding back every trailing U+FFFD also covers real invalid bytes, which only wait.
  constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  size_t end = text.size();
  while (end >= kReplacement.size() &&
         text.substr(end - kReplacement.size(), kReplacement.size()) == kReplacement)
    end -= kReplacement.size();
  const std::string_view stable = text.substr(0, end);
  size_t hold = 0;
  for (const auto& s : stop) {
    if (s.empty()) continue;
    for (size_t length = std::min(s.size() - 1, stable.size()); length > hold; --length)
      if (stable.ends_with(std::string_view(s).substr(0, length))) {
        hold = length;
        break;
      }
  }
  return end - hold;
}

int32_t sample_token(const std::vector<float>& logits, double temperature, double top_p,
                     double random) {
  const int64_t n = static_cast<int64_t>(logits.size());
  int32_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (logits[i] > logits[best] || (std::isnan(logits[best]) && !std::isnan(logits[i])))
      best = static_cast<int32_t>(i);
  if (temperature <= 0.0) return best;
  if (std::isnan(logits[best])) return best;
  std::vector<double> weights(n, 0.0);
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(logits[i])) continue;
    weights[i] = std::exp((static_cast<double>(logits[i]) - logits[best]) / temperature);
    total += weights[i];
  }
  if (!(total > 0.0) || !std::isfinite(total)) return best;
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return weights[a] > weights[b]; });
  // The nucleus: the fewest most-likely tokens whose mass reaches top_p.
  size_t kept = 0;
  double mass = 0.0;
  const double wanted = std::clamp(top_p, 0.0, 1.0) * total;
  while (kept < order.size() && (kept == 0 || mass < wanted)) mass += weights[order[kept++]];
  double target = random * mass;
  for (size_t i = 0; i < kept; ++i) {
    target -= weights[order[i]];
    if (target < 0.0) return order[i];
  }
  return order[kept - 1];
}

struct Engine::Job {
  GenerationRequest request;
  GenerationResult result;
  std::exception_ptr error;
  bool done = false;
  std::condition_variable finished;
  Clock::time_point queued_at = Clock::now();
};

Engine::Engine(const model::Model& model, const tokenizer::Tokenizer& tokenizer, const KvSetup& kv,
               int compute_threads, int max_queued, uint64_t default_seed, Metrics& metrics,
               PrefixCache* prefix_cache)
    : model_(model),
      tokenizer_(tokenizer),
      kv_(kv),
      pool_(compute_threads),
      metrics_(metrics),
      prefix_cache_(prefix_cache),
      max_queued_(max_queued),
      default_seed_(default_seed) {
  session_ = std::make_unique<model::Session>(model_, kv_.format, pool_, kv_.scales, kv_.state);
  worker_ = std::thread([this] { worker_loop(); });
}

Engine::~Engine() {
  begin_shutdown();
  if (worker_.joinable()) worker_.join();
}

void Engine::begin_shutdown() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    shutting_down_ = true;
  }
  wake_.notify_all();
}

std::shared_ptr<Engine::Job> Engine::admit(GenerationRequest request) {
  auto job = std::make_shared<Job>();
  job->request = std::move(request);
  std::lock_guard<std::mutex> lock(mutex_);
  if (shutting_down_) throw HttpError(503, "The server is shutting down.");
  if (in_system_ >= max_queued_) {
    ++metrics_.rejected_queue_full;
    throw HttpError(429, fmt::format("The request queue is full ({} requests waiting or running); "
                                     "retry later.",
                                     in_system_));
  }
  ++in_system_;
  ++metrics_.requests_waiting;
  queue_.push_back(job);
  wake_.notify_all();
  return job;
}

GenerationResult Engine::generate(GenerationRequest request) {
  request.stream.reset();
  std::shared_ptr<Job> job = admit(std::move(request));
  std::unique_lock<std::mutex> lock(mutex_);
  job->finished.wait(lock, [&] { return job->done; });
  if (job->error) std::rethrow_exception(job->error);
  return std::move(job->result);
}

void Engine::start(GenerationRequest request) {
  if (!request.stream) throw std::logic_error("Engine::start needs request.stream");
  admit(std::move(request));
}

void Engine::publish(TokenStream& stream, const std::string& text,
                     const std::vector<std::string>& stop) const {
  const size_t ready = streamable_prefix(text, stop);
  std::lock_guard<std::mutex> lock(stream.mutex);
  if (ready > stream.published_bytes) {
    stream.text.append(text, stream.published_bytes, ready - stream.published_bytes);
    stream.published_bytes = ready;
  }
  stream.changed.notify_all();
}

void Engine::worker_loop() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return !queue_.empty() || shutting_down_; });
      if (queue_.empty()) return;  // shutting down and drained
      job = queue_.front();
      queue_.pop_front();
    }
    --metrics_.requests_waiting;
    ++metrics_.requests_running;
    const double waited = seconds_since(job->queued_at);
    const auto started = Clock::now();
    try {
      job->result = run(job->request, job->queued_at);
      job->result.queue_seconds = waited;
      job->result.run_seconds = seconds_since(started);
    } catch (...) {
      job->error = std::current_exception();
      ++metrics_.failed;
    }
    --metrics_.requests_running;
    metrics_.kv_tokens_in_use = 0;
    if (TokenStream* stream = job->request.stream.get()) {
      std::lock_guard<std::mutex> lock(stream->mutex);
      if (job->error) {
        try {
          std::rethrow_exception(job->error);
        } catch (const std::exception& error) {
          stream->error = error.what();
        } catch (...) {
          stream->error = "unknown engine failure";
        }
      } else {
        // The rest of the final text: what was held back, now settled. What was published
        // is a prefix of it (streamable_prefix's guarantee).
        const std::string& text = job->result.text;
        if (stream->published_bytes < text.size())
          stream->text.append(text, stream->published_bytes);
        stream->published_bytes = std::max(stream->published_bytes, text.size());
        stream->result = job->result;
      }
      stream->finished = true;
      stream->changed.notify_all();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --in_system_;
      job->done = true;
    }
    job->finished.notify_all();
  }
}

GenerationResult Engine::run(const GenerationRequest& request, Clock::time_point queued_at) {
  GenerationResult result;
  const auto& prompt = request.prompt;
  const int64_t n = static_cast<int64_t>(prompt.size());
  const int64_t vocab = model_.config().vocab_size;
  std::vector<float> logits, log_probs;
  // A cached prefix is restored and only the rest computed, unless the prompt is scored
  // (echo): every prompt position then needs its logits, as in vLLM, which skips the cache
  // for prompt log-probs.
  PrefixHit hit;
  if (prefix_cache_ && !request.prompt_logprobs)
    hit = prefix_cache_->restore_longest(prompt, *session_);
  else
    session_->reset();
  result.cached_tokens = hit.tokens;
  result.cached_tier = hit.tier;

  // Prefill in the session's own batch size so that scoring the prompt (echo) or not
  // feeds the model exactly the same batches.
  const int64_t piece = std::max<int64_t>(1, session_->max_batch_tokens);
  std::vector<float> next_logits;
  if (request.prompt_logprobs) result.prompt_logprobs.push_back({prompt[0], std::nullopt, {}});
  for (int64_t begin = hit.tokens; begin < n; begin += piece) {
    const int64_t end = std::min(n, begin + piece);
    std::span<const int32_t> tokens(prompt.data() + begin, end - begin);
    // Logits of every prompt token when scoring the prompt, else of the last one only.
    const int64_t logits_from =
        request.prompt_logprobs ? 0 : (end == n ? end - begin - 1 : end - begin);
    session_->forward(tokens, logits_from, logits);
    metrics_.kv_tokens_in_use = session_->position();
    if (request.prompt_logprobs) {
      for (int64_t i = begin; i < end; ++i) {
        const float* row = logits.data() + (i - begin) * vocab;
        if (i + 1 < n) {
          log_softmax(row, vocab, log_probs);
          result.prompt_logprobs.push_back(
              logprobs_of(log_probs, prompt[i + 1], std::max(0, request.top_logprobs)));
        }
      }
    }
    if (end == n) {
      const float* last = logits.data() + (request.prompt_logprobs ? (end - begin - 1) * vocab : 0);
      next_logits.assign(last, last + vocab);
    }
  }

  bool stopped_by_string = false;
  std::mt19937_64 rng(request.seed ? *request.seed : default_seed_ + unseeded_requests_++);
  TokenStream* stream = request.stream.get();
  for (int64_t step = 0; step < request.max_tokens; ++step) {
    if (stream && stream->cancelled) {
      result.finish_reason = "abort";
      break;
    }
    const double random = static_cast<double>(rng() >> 11) * 0x1.0p-53;
    const int32_t token = sample_token(next_logits, request.temperature, request.top_p, random);
    if (step == 0) {
      metrics_.ttft_microseconds +=
          std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - queued_at).count();
      ++metrics_.ttft_count;
    }
    if (std::find(request.stop_token_ids.begin(), request.stop_token_ids.end(), token) !=
        request.stop_token_ids.end()) {
      result.finish_reason = "stop";
      break;
    }
    result.output.push_back(token);
    if (request.top_logprobs >= 0) {
      log_softmax(next_logits.data(), vocab, log_probs);
      result.output_logprobs.push_back(logprobs_of(log_probs, token, request.top_logprobs));
    }
    std::string text;
    if (!request.stop.empty() || stream)
      text = tokenizer_.decode(result.output, {.skip_special_tokens = true});
    if (!request.stop.empty()) {
      size_t cut = std::string::npos;
      for (const auto& stop : request.stop)
        if (!stop.empty()) cut = std::min(cut, text.find(stop));
      if (cut != std::string::npos) {
        result.text = text.substr(0, cut);
        result.finish_reason = "stop";
        stopped_by_string = true;
        break;
      }
    }
    if (stream) publish(*stream, text, request.stop);
    if (step + 1 == request.max_tokens) break;
    session_->decode(token, next_logits);
    metrics_.kv_tokens_in_use = session_->position();
  }
  if (!stopped_by_string)
    result.text = tokenizer_.decode(result.output, {.skip_special_tokens = true});
  if (prefix_cache_ && prefix_cache_->options().enabled) {
    // What the cache holds now: the prompt and the generated tokens fed back by decode().
    std::vector<int32_t> held(prompt.begin(), prompt.end());
    held.insert(held.end(), result.output.begin(),
                result.output.begin() + (session_->position() - n));
    prefix_cache_->insert(std::move(held), session_->snapshot());
  }
  metrics_.prompt_tokens += n;
  metrics_.generation_tokens += static_cast<int64_t>(result.output.size());
  (result.finish_reason == "stop"    ? metrics_.finished_stop
   : result.finish_reason == "abort" ? metrics_.finished_abort
                                     : metrics_.finished_length) += 1;
  return result;
}

}  // namespace kvaudit::serve
