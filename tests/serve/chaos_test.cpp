// serve under chaos: many keep-alive clients at once for a few seconds, valid requests mixed
// with malformed bodies, wrong types, oversized numbers, unknown routes and clients that hang
// up mid-stream. Every answer is a JSON status the client can act on (200, 400, 404, 413, 429),
// never a 5xx or a dropped connection; the engine fails nothing; greedy answers are the same
// after the storm as before it; memory does not grow with the requests served.
// make test runs 32 clients for 4 s; `make chaos-soak` runs them for 60 s through
// KVAUDIT_CHAOS_CLIENTS and KVAUDIT_CHAOS_SECONDS, and each run prints what it measured.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "serve/serve_test_util.h"

namespace kvaudit::serve {
namespace {

using nlohmann::json;
using testing::RunningServer;

int64_t resident_kib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  return -1;
}

int from_environment(const char* name, int fallback, int most) {
  const char* text = std::getenv(name);
  const int value = text ? std::atoi(text) : 0;
  return value > 0 ? std::min(value, most) : fallback;
}

// Sends a streamed completion over a raw socket, reads its first bytes and closes.
void hang_up_mid_stream(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(uint16_t(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0) {
    const std::string body =
        R"({"prompt": "x", "max_tokens": 200, "stream": true, "ignore_eos": true})";
    const std::string request =
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/json\r\nContent-Length: " +
        std::to_string(body.size()) + "\r\n\r\n" + body;
    ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
    char buffer[256];
    timeval wait{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
    (void)::recv(fd, buffer, sizeof buffer, 0);
  }
  ::close(fd);
}

TEST(ServeChaos, KeepAliveClientsWithMalformedBodiesMixedIn) {
  auto options = testing::options_for(testing::fixture_model());
  options.max_queued_requests = 256;
  RunningServer server(options);
  const json greedy = {
      {"prompt", "def add(a, b):\n    return"}, {"max_tokens", 6}, {"temperature", 0}};
  const auto [before_status, before] = server.post("/v1/completions", greedy);
  ASSERT_EQ(before_status, 200);

  const std::vector<std::pair<std::string, std::string>> kinds = {
      {"/v1/completions", greedy.dump()},
      {"/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": "},  // cut JSON
      {"/v1/completions", "[1, 2, 3]"},
      {"/v1/completions", R"({"prompt": 7, "max_tokens": "many"})"},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": 1e300})"},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": 2, "stream": true})"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user"}]})"},
      {"/v1/nowhere", "{}"},
      {"/v1/completions", std::string(9 << 20, 'x')},  // over --max-body-bytes
  };
  std::mutex mutex;
  std::map<int, int> statuses;
  std::atomic<int> dropped{0};
  std::map<std::pair<size_t, std::string>, int> dropped_kinds;  // (kinds index, error) -> count
  int64_t rss_after_warmup = -1;
  const int clients_at_once = from_environment("KVAUDIT_CHAOS_CLIENTS", 32, 256);
  const int seconds = from_environment("KVAUDIT_CHAOS_SECONDS", 4, 3600);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  std::vector<std::thread> clients;
  for (int c = 0; c < clients_at_once; ++c)
    clients.emplace_back([&, c] {
      httplib::Client client("127.0.0.1", server.port());
      client.set_keep_alive(true);
      client.set_read_timeout(30, 0);
      auto last_answer = std::chrono::steady_clock::now();
      std::string last_kind = "none";
      for (int i = 0; std::chrono::steady_clock::now() < until; ++i) {
        const auto& [path, body] = kinds[size_t(c * 7 + i) % kinds.size()];
        if (i % 11 == 5) {
          hang_up_mid_stream(server.port());  // a streaming client that leaves early
          // That can take seconds on a busy engine, and serve closes a keep-alive connection
          // idle for its advertised "Keep-Alive: timeout=2": a client honouring it opens a
          // new one rather than writing into the closed one.
          client.stop();
          continue;
        }
        const double idle_s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - last_answer).count();
        const std::string previous = last_kind;
        auto res = client.Post(path, body, "application/json");
        last_answer = std::chrono::steady_clock::now();
        last_kind = fmt::format("{} {}", res ? res->status : -1, body.substr(0, 30));
        std::lock_guard lock(mutex);
        if (!res) {
          ++dropped;
          ++dropped_kinds[{size_t(c * 7 + i) % kinds.size(),
                           httplib::to_string(res.error()) +
                               fmt::format(", idle {:.1f} s, after {}", idle_s, previous)}];
        } else
          ++statuses[res->status];
      }
    });
  std::this_thread::sleep_for(std::chrono::seconds(1));
  rss_after_warmup = resident_kib();
  for (auto& t : clients) t.join();
  const int64_t rss_end = resident_kib();
  std::string counts;
  int answered = 0;
  for (const auto& [status, count] : statuses) {
    counts += fmt::format(" {}x{}", status, count);
    answered += count;
  }
  std::printf(
      "chaos: %d keep-alive clients for %d s: %d answers (%s ), %d dropped, RSS %lld -> "
      "%lld KiB after the first second\n",
      clients_at_once, seconds, answered, counts.c_str(), dropped.load(),
      static_cast<long long>(rss_after_warmup), static_cast<long long>(rss_end));

  EXPECT_EQ(dropped.load(), 0);
  for (const auto& [why, count] : dropped_kinds)
    ADD_FAILURE() << count << " without an answer (" << why.second
                  << "): " << kinds[why.first].first << " "
                  << kinds[why.first].second.substr(0, 60);
  std::set<int> allowed = {200, 400, 404, 413, 429};
  int total = 0;
  for (const auto& [status, count] : statuses) {
    total += count;
    EXPECT_TRUE(allowed.count(status)) << "status " << status << " x" << count;
  }
  EXPECT_GT(statuses[200], 20) << total;
  EXPECT_GT(statuses[400], 20) << total;
  const std::string metrics = server.get("/metrics").second;
  EXPECT_NE(metrics.find("kvaudit:requests_failed_total{model_name=\"qwen3-pystd\"} 0"),
            std::string::npos)
      << metrics;
  const auto [after_status, after] = server.post("/v1/completions", greedy);
  ASSERT_EQ(after_status, 200);
  EXPECT_EQ(after["choices"][0]["text"], before["choices"][0]["text"]);
  // Three more seconds of requests must not have kept their memory (64 MiB of slack for
  // allocator arenas and the prefix cache's pool). Not under AddressSanitizer, whose
  // quarantine holds freed memory (256 MiB by default) on purpose.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVAUDIT_CHAOS_ASAN 1
#endif
#endif
#if !defined(__SANITIZE_ADDRESS__) && !defined(KVAUDIT_CHAOS_ASAN)
  EXPECT_LT(rss_end - rss_after_warmup, 64 * 1024) << rss_after_warmup << " -> " << rss_end;
#else
  (void)rss_end;
#endif
}

}  // namespace
}  // namespace kvaudit::serve
