// serve's streamed answers: server-sent events written as the generation worker publishes
// text, with the client's departure and the server's shutdown both ending a stream cleanly.
#include <chrono>
#include <memory>
#include <mutex>

#include "serve/server_impl.h"

namespace kvaudit::serve {

namespace {

// Writes one streamed answer's events as the worker publishes text: the chat role event
// first, a text event whenever new settled text is there (several tokens' text merge when
// the client reads slower than the engine generates), then the last event with the
// finish_reason, the usage event when asked, and [DONE]. httplib calls step() until done;
// each call waits at most kPoll, so a shutdown check runs between calls. A failed write
// means the client left: the worker is told to stop generating.
struct StreamWriter {
  static constexpr std::chrono::milliseconds kPoll{250};

  std::shared_ptr<TokenStream> stream;
  StreamIds ids;
  const ServedModel& served;
  int64_t prompt_tokens = 0;
  Streaming streaming;
  std::function<void(const GenerationResult&)> on_done;
  std::atomic<int>& open_streams;
  std::atomic<int64_t>& streams_cut;
  bool role_sent = false;
  bool done = false;

  ~StreamWriter() {
    if (!done) {
      stream->cancelled = true;
      ++streams_cut;
    }
    --open_streams;
  }

  bool write(httplib::DataSink& sink, const std::string& event) {
    if (sink.write(event.data(), event.size())) return true;
    stream->cancelled = true;
    return false;
  }

  bool step(httplib::DataSink& sink) {
    if (ids.chat && !role_sent) {
      role_sent = true;
      return write(sink, sse_event(role_chunk(ids, served)));
    }
    std::string text;
    bool finished = false;
    {
      std::unique_lock<std::mutex> lock(stream->mutex);
      stream->changed.wait_for(lock, kPoll,
                               [&] { return !stream->text.empty() || stream->finished; });
      text.swap(stream->text);
      finished = stream->finished;
    }
    if (!finished)
      return text.empty() || write(sink, sse_event(text_chunk(ids, served, text, nullptr)));
    std::string tail;
    if (!stream->error.empty()) {
      if (!text.empty()) tail += sse_event(text_chunk(ids, served, text, nullptr));
      tail += sse_event(error_body(500, "internal error: " + stream->error));
    } else {
      const GenerationResult& result = stream->result;
      tail += sse_event(text_chunk(ids, served, text, result.finish_reason));
      if (streaming.include_usage)
        tail += sse_event(usage_chunk(ids, served, prompt_tokens, result));
    }
    tail += "data: [DONE]\n\n";
    if (!write(sink, tail)) return false;
    done = true;
    if (stream->error.empty() && on_done) on_done(stream->result);
    sink.done();
    return true;
  }
};

}  // namespace

// stream=true: admits the request (a refusal is still a JSON error with its status), then
// answers with server-sent events while the worker generates.
void Server::Impl::stream_response(httplib::Response& res, GenerationRequest request,
                                   Streaming streaming, bool chat,
                                   std::chrono::steady_clock::time_point start) {
  auto stream = std::make_shared<TokenStream>();
  const int64_t prompt_tokens = static_cast<int64_t>(request.prompt.size());
  request.stream = stream;
  // Counted before the engine starts it: from then on /metrics shows it running, and a stop()
  // that saw it running but not yet counted would end the answer before its first event.
  ++open_streams;
  try {
    engine->start(std::move(request));
  } catch (...) {
    --open_streams;  // refused: no answer is streamed
    throw;
  }
  auto writer = std::shared_ptr<StreamWriter>(new StreamWriter{
      stream, new_stream_ids(chat), served, prompt_tokens, streaming,
      [this, start](const GenerationResult& result) { record_timing(result, start); }, open_streams,
      streams_cut});
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [writer](size_t, httplib::DataSink& sink) {
    return writer->step(sink);
  });
}

}  // namespace kvaudit::serve
