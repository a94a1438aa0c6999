// serve's HTTP server (Server::Impl), shared by the files that build it: startup.cpp (start-up
// in SGLang's order and log format), routes.cpp (the HTTP routes and /metrics), stream.cpp
// (server-sent events) and server.cpp (bind, run, stop, /get_server_info). Private to serve/.
#pragma once

// httplib's CPPHTTPLIB_* macros come from CMakeLists.txt, for every target alike.
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/internal.h"

namespace kvaudit::serve {

struct Server::Impl {
  const engines::Registry* registry = nullptr;
  ServeOptions options;
  LogSink log;
  checkpoint::ModelFacts facts;
  std::unique_ptr<model::Model> model;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  KvSetup kv;
  PoolPlan pool;
  ServedModel served;
  Metrics metrics;
  std::unique_ptr<PrefixCache> prefix_cache;  // null: none (a hybrid model)
  std::unique_ptr<Engine> engine;             // after prefix_cache: destroyed first
  httplib::Server http;
  socket_t listen_socket = INVALID_SOCKET;  // the socket httplib binds (set_socket_options)
  int port = -1;
  std::atomic<bool> stopping{false};
  std::atomic<bool> run_entered{false}, run_returned{false};
  std::atomic<int> open_streams{0};     // streamed answers still being written
  std::atomic<int64_t> streams_cut{0};  // ended before their last event (client or shutdown)
  int64_t created = 0;

  // One start-up or shutdown line, timestamped as SGLang prints them.
  void line(const std::string& text);

  // (name, value) in SGLang's ServerArgs order; `resolved` switches kv_cache_dtype.
  std::vector<std::pair<std::string, nlohmann::json>> server_args(bool resolved) const;
  std::string server_args_repr() const;

  void start_up();
  // The prefix cache's tiers as the options ask, with SGLang's checks and its host-pool line.
  void set_up_prefix_cache();
  void add_routes();
  nlohmann::json server_info() const;
  std::string metrics_text() const;

  using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;
  // The parts of add_routes, in registration order.
  Handler wrap(Handler handler);
  void add_info_routes();
  void add_token_routes();
  void add_generation_routes();
  void add_access_handlers();
  void record_timing(const GenerationResult& result, std::chrono::steady_clock::time_point start);
  void stream_response(httplib::Response& res, GenerationRequest request, Streaming streaming,
                       bool chat, std::chrono::steady_clock::time_point start);
};

// Answers `body` as JSON with `status`.
void send_json(httplib::Response& res, int status, const nlohmann::json& body);

}  // namespace kvaudit::serve
