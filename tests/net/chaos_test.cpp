// Chaos for the client every live path uses (probe, watch, the load bench): a raw TCP peer
// on loopback that resets the connection, cuts an answer or a stream short, or dribbles an
// answer byte by byte. Each request ends in a one-line RequestError or a correct answer
// after a retry, within a bound; never a hang or a crash.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "net/net.h"

namespace kvaudit::net {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

// Accepts connections on 127.0.0.1 and hands each (with its index) to `behave`, one at a time.
class RawPeer {
 public:
  explicit RawPeer(std::function<void(int fd, int index)> behave) : behave_(std::move(behave)) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof address);
    ::listen(listen_fd_, 16);
    socklen_t length = sizeof address;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this] {
      for (int index = 0;; ++index) {
        const int fd = ::accept(listen_fd_, nullptr, nullptr);
        if (fd < 0 || stopping_) {
          if (fd >= 0) ::close(fd);
          return;
        }
        read_request(fd);
        behave_(fd, index);
        ::close(fd);
      }
    });
  }
  ~RawPeer() {
    stopping_ = true;
    ::shutdown(listen_fd_, SHUT_RDWR);
    ::close(listen_fd_);
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  static void send_all(int fd, std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return;
      bytes.remove_prefix(size_t(n));
    }
  }
  // An RST instead of a FIN: the peer "crashed".
  static void reset(int fd) {
    linger hard{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
  }

 private:
  // Reads the request head and a Content-Length body, bounded.
  static void read_request(int fd) {
    std::string in;
    char buffer[4096];
    timeval wait{2, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
    while (in.find("\r\n\r\n") == std::string::npos && in.size() < (1 << 20)) {
      const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
      if (n <= 0) return;
      in.append(buffer, size_t(n));
    }
    const size_t head = in.find("\r\n\r\n") + 4;
    size_t length = 0;
    if (const size_t at = in.find("Content-Length: "); at != std::string::npos)
      length = std::stoul(in.substr(at + 16));
    while (in.size() < head + length) {
      const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
      if (n <= 0) return;
      in.append(buffer, size_t(n));
    }
  }

  std::function<void(int, int)> behave_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

const std::string kModels = R"({"object":"list","data":[{"id":"m","object":"model"}]})";

std::string answer(const std::string& body, const std::string& type = "application/json") {
  return "HTTP/1.1 200 OK\r\nContent-Type: " + type +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" +
         body;
}

ClientOptions quick() {
  ClientOptions options;
  options.connect_timeout = 1000ms;
  options.read_timeout = 1000ms;
  options.max_retries = 2;
  options.backoff_initial = 10ms;
  return options;
}

TEST(NetChaos, AResetConnectionIsRetriedAndTheNextAnswerIsRead) {
  RawPeer peer([](int fd, int index) {
    if (index < 2) return RawPeer::reset(fd);  // the first two die mid-request
    RawPeer::send_all(fd, answer(kModels));
  });
  Client client(parse_url(peer.url()), quick());
  const auto models = list_models(client);
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(models[0].id, "m");
  EXPECT_EQ(client.stats().attempts, 3);
}

TEST(NetChaos, APeerThatAlwaysResetsEndsInOneLineAfterItsRetries) {
  RawPeer peer([](int fd, int) { RawPeer::reset(fd); });
  Client client(parse_url(peer.url()), quick());
  const auto started = std::chrono::steady_clock::now();
  try {
    list_models(client);
    FAIL() << "expected RequestError";
  } catch (const RequestError& error) {
    EXPECT_EQ(std::string(error.what()).find('\n'), std::string::npos) << error.what();
    EXPECT_THAT(error.what(), HasSubstr(peer.url()));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - started, 5s);
  EXPECT_EQ(client.stats().attempts, 3);
}

TEST(NetChaos, AnAnswerCutShortIsAnErrorNotAParsedFragment) {
  RawPeer peer([](int fd, int) {
    const std::string whole = answer(kModels);
    RawPeer::send_all(fd, whole.substr(0, whole.size() - 20));  // Content-Length promises more
  });
  ClientOptions options = quick();
  options.max_retries = 0;
  Client client(parse_url(peer.url()), options);
  EXPECT_THROW(list_models(client), RequestError);
}

TEST(NetChaos, AStreamCutMidEventEndsWithTheEventsBeforeIt) {
  RawPeer peer([](int fd, int) {
    RawPeer::send_all(fd,
                      "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                      "Transfer-Encoding: chunked\r\n\r\n");
    const std::string first = "data: {\"n\": 1}\n\n";
    const std::string partial = "data: {\"n\": 2, \"te";
    for (const std::string& piece : {first, partial}) {
      char size[16];
      std::snprintf(size, sizeof size, "%zx\r\n", piece.size());
      RawPeer::send_all(fd, std::string(size) + piece + "\r\n");
    }
    RawPeer::reset(fd);  // no last chunk: the stream dies mid-event
  });
  ClientOptions options = quick();
  // Retries allowed: the client must still not ask again once part of the stream reached
  // the caller (the peer would send event 1 a second time).
  options.max_retries = 2;
  Client client(parse_url(peer.url()), options);
  std::vector<std::string> events;
  SseParser parser(
      client.where("/v1/completions"), [&](std::string_view event) { events.emplace_back(event); },
      1 << 16);
  const auto started = std::chrono::steady_clock::now();
  try {
    client.post_stream("/v1/completions", nlohmann::json{{"stream", true}},
                       [&](std::string_view piece) {
                         parser.feed(piece);
                         return true;
                       });
  } catch (const RequestError&) {
    // A transport error is a fine ending; what was parsed stays parsed.
  }
  EXPECT_LT(std::chrono::steady_clock::now() - started, 5s);
  ASSERT_EQ(events.size(), 1u);  // the cut event never reaches the caller half-formed
  EXPECT_EQ(events[0], "{\"n\": 1}");
}

TEST(NetChaos, AnAnswerDribbledByteByByteArrivesWhole) {
  RawPeer peer([](int fd, int) {
    for (char c : answer(kModels)) {
      RawPeer::send_all(fd, std::string(1, c));
      std::this_thread::sleep_for(1ms);
    }
  });
  Client client(parse_url(peer.url()), quick());
  const auto models = list_models(client);
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(models[0].id, "m");
}

TEST(NetChaos, APeerThatGoesSilentMidAnswerTimesOut) {
  std::atomic<bool> release{false};
  RawPeer peer([&](int fd, int) {
    const std::string whole = answer(kModels);
    RawPeer::send_all(fd, whole.substr(0, whole.size() / 2));
    for (int i = 0; i < 200 && !release; ++i) std::this_thread::sleep_for(10ms);
  });
  ClientOptions options = quick();
  options.read_timeout = 300ms;
  options.max_retries = 0;
  Client client(parse_url(peer.url()), options);
  const auto started = std::chrono::steady_clock::now();
  EXPECT_THROW(list_models(client), RequestError);
  EXPECT_LT(std::chrono::steady_clock::now() - started, 2s);
  release = true;
}

}  // namespace
}  // namespace kvaudit::net
