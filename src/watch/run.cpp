// watch run: the loop that follows one source, and the /metrics endpoint it feeds.
#include <httplib.h>
#include <poll.h>
#include <unistd.h>

#include <fmt/format.h>

#include <chrono>
#include <mutex>
#include <thread>

#include "util/util.h"
#include "watch/watch.h"

namespace kvaudit::watch {

namespace {

double now_unix_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Waits up to `seconds` in short steps, returning early when `stopping` says so.
void wait(double seconds, const std::function<bool()>& stopping) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!stopping() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

}  // namespace

struct MetricsServer::Impl {
  httplib::Server http;
  std::mutex mutex;
  std::string metrics = "# kvaudit watch: nothing read yet\n";
  int port = -1;
  std::thread thread;
};

MetricsServer::MetricsServer(const std::string& host, int port) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.http.Get("/metrics", [&s](const httplib::Request&, httplib::Response& response) {
    std::lock_guard<std::mutex> lock(s.mutex);
    response.set_content(s.metrics, "text/plain; version=0.0.4; charset=utf-8");
  });
  s.http.Get("/", [](const httplib::Request&, httplib::Response& response) {
    response.set_content("kvaudit watch: metrics at /metrics\n", "text/plain");
  });
  s.http.set_keep_alive_timeout(2);
  s.http.set_read_timeout(10);
  s.http.set_write_timeout(10);
  if (port == 0)
    s.port = s.http.bind_to_any_port(host);
  else if (port > 0 && port < 65536 && s.http.bind_to_port(host, port))
    s.port = port;
  if (s.port <= 0)
    throw InputError(fmt::format("{}:{}", host, port),
                     "cannot listen here (address in use, or not an address of this machine)");
  s.thread = std::thread([&s] { s.http.listen_after_bind(); });
}

MetricsServer::~MetricsServer() {
  Impl& s = *impl_;
  // listen_after_bind may not have started its loop yet, where stop() would be lost.
  for (int i = 0; i < 2000 && !s.http.is_running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  s.http.stop();
  if (s.thread.joinable()) s.thread.join();
}

int MetricsServer::port() const {
  return impl_->port;
}

void MetricsServer::set(std::string metrics) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->metrics = std::move(metrics);
}

SourceKind source_kind(const std::string& source) {
  if (source == "-") return SourceKind::stdin_stream;
  if (source.rfind("http://", 0) == 0 || source.rfind("https://", 0) == 0)
    return SourceKind::server;
  return SourceKind::file;
}

namespace {

// One round trip against the watched server, into state.roundtrip. Its own time limit keeps
// it inside the watch's (a server that fails it is a failed run, not the end of the watch).
void run_roundtrip_once(const engines::Registry& registry, const RunOptions& options,
                        WatchState& state) {
  RoundTripWatch& r = state.roundtrip;
  ++r.runs;
  r.last_unix_s = now_unix_s();
  r.excess_by_tier.clear();
  try {
    const probe::RoundTripResult result =
        probe::run_roundtrip(registry, options.source, options.client, options.roundtrip);
    r.last_verdict = result.verdict;
    r.last_reason = result.reason;
    if (result.verdict == "a tier changed the answers") ++r.changed;
    for (const auto& check : result.checks)
      if (check.prompts > 0) r.excess_by_tier[check.name] = check.excess;
  } catch (const InputError& error) {
    ++r.failed_runs;
    r.last_verdict = "failed";
    r.last_reason = error.what();
  }
}

}  // namespace

WatchState run(const engines::Registry& registry, const RunOptions& options,
               const std::function<bool()>& stopping,
               const std::function<void(const WatchState&)>& on_change,
               const std::function<void(const std::string&)>& on_metrics) {
  const auto started = std::chrono::steady_clock::now();
  auto over = [&] {
    return stopping() ||
           (options.for_s > 0 &&
            std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() >=
                options.for_s);
  };
  const SourceKind kind = source_kind(options.source);
  if (kind == SourceKind::server) {
    ServerWatcher watcher(registry, options.source, options.watch, options.client);
    double next_roundtrip = 0;
    do {
      if (watcher.poll(now_unix_s())) on_change(watcher.state());
      if (options.roundtrip_every_s > 0 && watcher.state().source_up &&
          now_unix_s() >= next_roundtrip && !over()) {
        run_roundtrip_once(registry, options, watcher.state());
        next_roundtrip = now_unix_s() + options.roundtrip_every_s;
        on_change(watcher.state());
      }
      on_metrics(render_metrics(watcher.state()));
      if (options.once) break;
      wait(options.interval_s, over);
    } while (!over());
    return watcher.state();
  }

  const std::string label = kind == SourceKind::stdin_stream ? "stdin" : options.source;
  if (kind == SourceKind::file) {
    std::error_code ec;
    if (std::filesystem::is_directory(options.source, ec))
      throw InputError(options.source, "is a folder, expected a log file");
  }
  LogWatcher watcher(registry, label, options.watch);
  bool checked_binary = false;
  auto on_line = [&](std::string_view line) {
    if (!checked_binary) {
      checked_binary = true;
      if (line.find('\0') != std::string_view::npos)
        throw InputError(label, "binary data (NUL bytes), not a text log");
    }
    if (watcher.add_line(line, now_unix_s())) on_change(watcher.state());
  };

  if (kind == SourceKind::stdin_stream) {
    LineSplitter splitter(options.watch.max_line_bytes);
    std::vector<char> buffer(1 << 16);
    for (;;) {
      pollfd p{STDIN_FILENO, POLLIN, 0};
      const int ready = ::poll(&p, 1, 100);
      if (over()) break;
      if (ready <= 0) continue;
      const ssize_t n = ::read(STDIN_FILENO, buffer.data(), buffer.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        splitter.flush(on_line);
        break;  // the writer (journalctl -f) ended
      }
      splitter.feed(std::string_view(buffer.data(), static_cast<size_t>(n)), on_line);
      on_metrics(render_metrics(watcher.state()));
    }
    on_metrics(render_metrics(watcher.state()));
    return watcher.state();
  }

  FileFollower follower(options.source, options.watch.max_line_bytes);
  do {
    const FileFollower::Poll poll = follower.poll(on_line);
    WatchState& state = watcher.state();
    state.source_up = poll.present;
    state.last_check_unix_s = now_unix_s();
    state.rotations += poll.rotated ? 1 : 0;
    state.truncations += poll.truncated ? 1 : 0;
    if (!poll.present && options.once) throw InputError(options.source, "no such file");
    on_metrics(render_metrics(state));
    if (options.once) break;
    wait(options.interval_s, over);
  } while (!over());
  return watcher.state();
}

}  // namespace kvaudit::watch
