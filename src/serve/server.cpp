// serve's Server: configures cpp-httplib, binds, runs until stopped (accepted requests are
// answered before it returns) and reports /get_server_info in SGLang's shape (server args
// flattened at the top, scheduler info, internal_states, version).
#include <fmt/format.h>
#include <malloc.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "serve/server_impl.h"
#include "util/util.h"

namespace kvaudit::serve {

namespace {

using nlohmann::json;
constexpr const char* kSglangReady = "The server is fired up and ready to roll!";

}  // namespace

Server::Server(const engines::Registry& registry, const ServeOptions& options, LogSink log)
    : impl_(std::make_unique<Impl>()) {
  impl_->registry = &registry;
  impl_->options = options;
  impl_->log = log ? std::move(log) : [](std::string_view) {};
  impl_->start_up();
  impl_->add_routes();
  // Request bodies run to --max-body-bytes (8 MiB). glibc raises its mmap threshold to the
  // size of each large block freed, after which such bodies come from per-thread arenas that
  // keep the memory: 16 clients sending 9 MiB bodies grew RSS by 90 MB in 3 s (ServeChaos).
  // A fixed threshold keeps every block over 1 MiB mapped and returned when freed.
  ::mallopt(M_MMAP_THRESHOLD, 1 << 20);
  const size_t threads = static_cast<size_t>(options.http_threads);
  impl_->http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  // httplib's default also sets SO_REUSEPORT, which lets a second server bind a port that is
  // in use and silently split the traffic: keep SO_REUSEADDR only.
  impl_->http.set_socket_options([impl = impl_.get()](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const void*>(&yes), sizeof yes);
    impl->listen_socket = sock;
  });
  impl_->http.set_payload_max_length(static_cast<size_t>(options.max_body_bytes));
  impl_->http.set_tcp_nodelay(true);
  impl_->http.set_keep_alive_max_count(1 << 20);
  impl_->http.set_keep_alive_timeout(2);  // bounds how long a drain waits for idle clients
  impl_->http.set_read_timeout(30);
  impl_->http.set_write_timeout(30);
}

Server::~Server() {
  stop();
  impl_->engine.reset();  // drains anything still queued
}

int Server::bind() {
  Impl& s = *impl_;
  if (s.options.port == 0) {
    s.port = s.http.bind_to_any_port(s.options.host);
  } else if (s.options.port > 0 && s.options.port < 65536 &&
             s.http.bind_to_port(s.options.host, s.options.port)) {
    s.port = s.options.port;
  } else {
    s.port = -1;
  }
  if (s.port <= 0)
    throw InputError(fmt::format("{}:{}", s.options.host, s.options.port),
                     "cannot listen here (address in use, or not an address of this machine)");
  // httplib 0.11 listens with a backlog of 5: a burst of clients connecting at once (32 in
  // ServeChaos) overflowed the accept queue and some had their first request cut. Listening
  // again on the bound socket only raises the backlog (Linux: the kernel caps it at somaxconn).
  if (s.listen_socket != INVALID_SOCKET) ::listen(s.listen_socket, SOMAXCONN);
  return s.port;
}

void Server::run() {
  Impl& s = *impl_;
  if (s.port <= 0) bind();
  s.log(fmt::format("INFO:     Uvicorn running on http://{}:{} (Press CTRL+C to quit)",
                    s.options.host, s.port));
  s.line(fmt::format("{} Serving {} on http://{}:{}", kSglangReady, s.served.id, s.options.host,
                     s.port));
  s.run_entered = true;
  if (!s.stopping) s.http.listen_after_bind();
  s.run_returned = true;
  // Handler threads have finished; the engine has nothing left in flight.
  s.engine->begin_shutdown();
  if (const int64_t cut = s.streams_cut.load(); cut > 0)
    s.line(
        fmt::format("Shutdown complete: {} streamed answer(s) ended early because their "
                    "client went away; every other accepted request was answered.",
                    cut));
  else
    s.line("Shutdown complete: every accepted request was answered.");
}

void Server::stop() {
  Impl& s = *impl_;
  s.stopping = true;
  // run() may sit between its `stopping` check and httplib's listen loop, where http.stop()
  // would be lost: give it a moment to start listening first.
  for (int i = 0; i < 2000 && s.run_entered && !s.run_returned && !s.http.is_running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // httplib ends chunked answers as soon as it stops: let accepted streams finish first. Each
  // is bounded (max_tokens, and a client that stops reading fails a write within the write
  // timeout), and new requests are refused meanwhile.
  while (s.open_streams > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  s.http.stop();
}

int Server::port() const {
  return impl_->port;
}
const PoolPlan& Server::pool() const {
  return impl_->pool;
}

json Server::server_info() const {
  return impl_->server_info();
}

json Server::Impl::server_info() const {
  const Impl& s = *this;
  json args = json::object();
  for (const auto& [key, value] : s.server_args(true)) args[key] = value;
  json info = args;
  info["kv_cache_dtype_requested"] = s.kv.requested;
  info["status"] = "ready";
  info["max_total_num_tokens"] = s.pool.max_total_num_tokens;
  info["max_req_input_len"] = s.pool.max_req_input_len;
  json state = args;
  state["last_gen_throughput"] = 0.0;
  state["memory_usage"] = {
      {"weight", std::round(s.pool.weight_bytes / kBytesPerGiB * 100) / 100},
      {"kvcache", std::round(double((s.pool.max_total_num_tokens + s.pool.page_size) *
                                    s.pool.cell_bytes_per_token) /
                             kBytesPerGiB * 100) /
                      100},
      {"token_capacity", s.pool.max_total_num_tokens}};
  state["waiting_queue_size"] = s.metrics.requests_waiting.load();
  state["running_batch_size"] = s.metrics.requests_running.load();
  info["internal_states"] = json::array({state});
  info["version"] = s.kv.engine_version;
  info["kvaudit"] = {{"engine_emulated", kEmulatedEngine},
                     {"kv_format", s.kv.format.spec},
                     {"scale_source", engines::scale_source_name(s.kv.scale_source)},
                     {"k_scales", s.kv.k_scales},
                     {"v_scales", s.kv.v_scales},
                     {"resolution_rule", s.kv.resolved.rule_id},
                     {"cell_bytes_per_token", s.pool.cell_bytes_per_token},
                     {"context_length", s.pool.context_length}};
  return info;
}

}  // namespace kvaudit::serve
