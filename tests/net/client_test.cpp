// The HTTP client against servers started in-process on 127.0.0.1 (ephemeral ports):
// URL forms, retries with backoff and Retry-After, every failure mode as one clear
// RequestError, the bearer token, and the concurrency limit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "common/loopback_server.h"
#include "net/net.h"

namespace kvaudit::net {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

// The shared loopback server, started by the test once its routes are set.
struct LocalServer : kvaudit::testing::LoopbackServer {
  httplib::Server& server = http;
  void start() { ASSERT_TRUE(LoopbackServer::start()); }
};

ClientOptions fast_options() {
  ClientOptions options;
  options.connect_timeout = 500ms;
  options.read_timeout = 500ms;
  options.max_retries = 3;
  options.backoff_initial = 10ms;
  options.backoff_max = 50ms;
  return options;
}

// A port nothing listens on: bind one, note it, close it.
int closed_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

TEST(NetUrl, Forms) {
  Url a = parse_url("http://127.0.0.1:8000/v1/");
  EXPECT_EQ(a.scheme, "http");
  EXPECT_EQ(a.host, "127.0.0.1");
  EXPECT_EQ(a.port, 8000);
  EXPECT_EQ(a.base_path, "");
  EXPECT_EQ(a.text(), "http://127.0.0.1:8000");
  Url b = parse_url("https://api.example.com/proxy/llm");
  EXPECT_EQ(b.port, 443);
  EXPECT_EQ(b.base_path, "/proxy/llm");
  EXPECT_EQ(b.text(), "https://api.example.com/proxy/llm");
  Url c = parse_url("localhost:30000");
  EXPECT_EQ(c.scheme, "http");
  EXPECT_EQ(c.port, 30000);
  Url d = parse_url("http://[::1]:8080");
  EXPECT_EQ(d.host, "::1");
  EXPECT_EQ(d.text(), "http://[::1]:8080");
  for (const char* bad :
       {"", "ftp://x", "http://:80", "http://host:0", "http://host:99999", "http://host:12ab",
        "http://user:pw@host", "http://[::1", "::1:80", "http://host/path?q=1", "http://ho st"}) {
    EXPECT_THROW(parse_url(bad), InputError) << bad;
  }
}

TEST(NetClient, RetriesServerErrorsThenSucceeds) {
  std::atomic<int> calls{0};
  LocalServer local;
  local.server.Get("/v1/models", [&](const httplib::Request&, httplib::Response& res) {
    if (calls++ < 2) {
      res.status = 503;
      res.set_content(R"({"error":{"message":"warming up"}})", "application/json");
      return;
    }
    res.set_content(R"({"object":"list","data":[{"id":"m","max_model_len":4096}]})",
                    "application/json");
  });
  local.start();
  Client client(parse_url(local.url()), fast_options());
  auto models = list_models(client);
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(models[0].id, "m");
  EXPECT_EQ(models[0].max_model_len, 4096);
  EXPECT_EQ(calls.load(), 3);
  EXPECT_EQ(client.stats().retries, 2);
}

TEST(NetClient, PersistentServerErrorNamesStatusAndMessage) {
  std::atomic<int> calls{0};
  LocalServer local;
  local.server.Get("/health", [&](const httplib::Request&, httplib::Response& res) {
    calls++;
    res.status = 500;
    res.set_content(R"({"object":"error","message":"CUDA out of memory","code":500})",
                    "application/json");
  });
  local.start();
  Client client(parse_url(local.url()), fast_options());
  try {
    client.get("/health");
    FAIL() << "expected RequestError";
  } catch (const RequestError& error) {
    EXPECT_EQ(error.kind(), FailureKind::http);
    EXPECT_EQ(error.status(), 500);
    EXPECT_TRUE(error.server_unavailable());
    EXPECT_THAT(error.what(), HasSubstr("HTTP 500: CUDA out of memory"));
    EXPECT_THAT(error.what(), HasSubstr("after 4 attempts"));
    EXPECT_THAT(error.what(), HasSubstr("/health"));
  }
  EXPECT_EQ(calls.load(), 4);
}

TEST(NetClient, HonoursRetryAfter) {
  std::atomic<int> calls{0};
  LocalServer local;
  local.server.Get("/x", [&](const httplib::Request&, httplib::Response& res) {
    if (calls++ == 0) {
      res.status = 429;
      res.set_header("Retry-After", "1");
      return;
    }
    res.set_content("{}", "application/json");
  });
  local.start();
  ClientOptions options = fast_options();
  options.backoff_max = 2000ms;  // Retry-After is capped by backoff_max
  Client client(parse_url(local.url()), options);
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(client.get("/x").status, 200);
  auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_GE(waited, 900ms);
  EXPECT_EQ(parse_retry_after(" 7 "), std::chrono::milliseconds(7000));
  EXPECT_FALSE(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"));
  EXPECT_FALSE(parse_retry_after(""));
}

TEST(NetClient, ConnectionRefusedIsRetriedThenReported) {
  Client client(parse_url("http://127.0.0.1:" + std::to_string(closed_port())), fast_options());
  try {
    client.get("/v1/models");
    FAIL() << "expected RequestError";
  } catch (const RequestError& error) {
    EXPECT_EQ(error.kind(), FailureKind::refused);
    EXPECT_TRUE(error.server_unavailable());
    EXPECT_THAT(error.what(), HasSubstr("connection refused"));
    EXPECT_THAT(error.what(), HasSubstr("4 attempts"));
  }
  EXPECT_EQ(client.stats().attempts, 4);
}

TEST(NetClient, DnsFailureIsNotRetried) {
  Client client(parse_url("http://kvaudit-no-such-host.invalid:8000"), fast_options());
  try {
    client.get("/health");
    FAIL() << "expected RequestError";
  } catch (const RequestError& error) {
    EXPECT_EQ(error.kind(), FailureKind::dns);
    EXPECT_THAT(error.what(), HasSubstr("cannot resolve host 'kvaudit-no-such-host.invalid'"));
  }
  EXPECT_EQ(client.stats().attempts, 1);
}

TEST(NetClient, StallEndsInATimeout) {
  std::atomic<bool> release{false};
  LocalServer local;
  local.server.Get("/slow", [&](const httplib::Request&, httplib::Response& res) {
    for (int i = 0; i < 100 && !release; ++i) std::this_thread::sleep_for(20ms);
    res.set_content("{}", "application/json");
  });
  local.start();
  ClientOptions options = fast_options();
  options.read_timeout = 200ms;
  options.max_retries = 1;
  Client client(parse_url(local.url()), options);
  auto start = std::chrono::steady_clock::now();
  try {
    client.get("/slow");
    FAIL() << "expected RequestError";
  } catch (const RequestError& error) {
    EXPECT_EQ(error.kind(), FailureKind::timeout);
    EXPECT_THAT(error.what(), HasSubstr("no answer within 0.2 s"));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  release = true;
}

TEST(NetClient, GarbageAndErrorsBecomeClearMessages) {
  LocalServer local;
  local.server.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("<html>502 Bad Gateway</html>", "text/html");
  });
  local.server.Post("/v1/completions", [](const httplib::Request&, httplib::Response& res) {
    res.status = 400;
    res.set_content(R"({"error":{"message":"prompt is too long","type":"invalid_request"}})",
                    "application/json");
  });
  local.start();
  Client client(parse_url(local.url()), fast_options());
  try {
    list_models(client);
    FAIL();
  } catch (const RequestError& error) {
    EXPECT_EQ(error.kind(), FailureKind::malformed);
    EXPECT_THAT(error.what(), HasSubstr("/v1/models: malformed answer: not JSON"));
    EXPECT_FALSE(error.server_unavailable());
  }
  try {
    complete(client, CompletionRequest{});
    FAIL();
  } catch (const RequestError& error) {
    EXPECT_EQ(error.kind(), FailureKind::http);
    EXPECT_EQ(error.status(), 400);
    EXPECT_THAT(error.what(), HasSubstr("HTTP 400: prompt is too long"));
  }
  EXPECT_EQ(client.stats().retries, 0);  // 4xx is an answer, not retried
}

TEST(NetClient, OversizedAnswerIsRefused) {
  LocalServer local;
  local.server.Get("/big", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(std::string(1 << 20, 'x'), "text/plain");
  });
  local.start();
  ClientOptions options = fast_options();
  options.max_response_bytes = 4096;
  Client client(parse_url(local.url()), options);
  try {
    client.get("/big");
    FAIL();
  } catch (const RequestError& error) {
    EXPECT_EQ(error.kind(), FailureKind::too_large);
  }
}

TEST(NetClient, SendsBearerTokenAndBasePath) {
  LocalServer local;
  std::string seen_auth, seen_body;
  local.server.Post("/proxy/v1/completions",
                    [&](const httplib::Request& req, httplib::Response& res) {
                      seen_auth = req.get_header_value("Authorization");
                      seen_body = req.body;
                      res.set_content(R"({"choices":[{"text":" 42","finish_reason":"stop"}],
                        "usage":{"prompt_tokens":5,"completion_tokens":2}})",
                                      "application/json");
                    });
  local.start();
  ClientOptions options = fast_options();
  options.api_key = "sk-test";
  Client client(parse_url(local.url() + "/proxy/v1"), options);
  CompletionRequest request;
  request.prompt = "17 + 25 =";
  request.max_tokens = 4;
  request.seed = 3;
  Completion answer = complete(client, request);
  EXPECT_EQ(answer.text, " 42");
  EXPECT_EQ(answer.prompt_tokens, 5);
  EXPECT_EQ(seen_auth, "Bearer sk-test");
  auto body = nlohmann::json::parse(seen_body);
  EXPECT_EQ(body["prompt"], "17 + 25 =");
  EXPECT_EQ(body["temperature"], 0.0);
  EXPECT_EQ(body["seed"], 3);
  EXPECT_FALSE(body.contains("logprobs"));
}

TEST(NetClient, ConcurrencyIsBounded) {
  std::atomic<int> in_flight{0}, peak{0};
  LocalServer local;
  local.server.new_task_queue = [] { return new httplib::ThreadPool(16); };
  local.server.Get("/work", [&](const httplib::Request&, httplib::Response& res) {
    int now = ++in_flight;
    int seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
    std::this_thread::sleep_for(40ms);
    --in_flight;
    res.set_content("{}", "application/json");
  });
  local.start();
  ClientOptions options = fast_options();
  options.max_concurrency = 3;
  Client client(parse_url(local.url()), options);
  std::vector<std::thread> threads;
  for (int i = 0; i < 12; ++i) threads.emplace_back([&] { client.get("/work"); });
  for (auto& t : threads) t.join();
  EXPECT_LE(peak.load(), 3);
  EXPECT_GE(peak.load(), 2);
}

TEST(NetClient, HttpsAgainstAPlainServerIsATlsFailure) {
  LocalServer local;
  local.server.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok", "text/plain");
  });
  local.start();
  Client client(parse_url("https://127.0.0.1:" + std::to_string(local.port)), fast_options());
  try {
    client.get("/health");
    FAIL();
  } catch (const RequestError& error) {
    EXPECT_EQ(error.kind(), FailureKind::tls);
    EXPECT_THAT(error.what(), HasSubstr("TLS failure"));
  }
}

TEST(NetClient, ApiKeyFromEnvironment) {
  setenv("KVAUDIT_API_KEY", "", 1);
  setenv("OPENAI_API_KEY", "sk-openai", 1);
  EXPECT_EQ(api_key_from_environment(), "sk-openai");
  setenv("KVAUDIT_API_KEY", "sk-kvaudit", 1);
  EXPECT_EQ(api_key_from_environment(), "sk-kvaudit");
  unsetenv("KVAUDIT_API_KEY");
  unsetenv("OPENAI_API_KEY");
  EXPECT_EQ(api_key_from_environment(), "");
}

// A server that sends 8 MB when 100 bytes are wanted (as one that ignores Range does): the
// client keeps the bytes it asked for and stops reading; its request headers reach the server.
TEST(NetClient, StopsReadingAfterTheBytesItNeeds) {
  std::atomic<int> served{0};
  std::string range_seen;
  LocalServer local;
  local.server.Get("/big", [&](const httplib::Request& req, httplib::Response& res) {
    ++served;
    range_seen = req.get_header_value("X-Probe");
    res.set_chunked_content_provider("application/octet-stream",
                                     [](size_t offset, httplib::DataSink& sink) {
                                       if (offset >= (8u << 20)) {
                                         sink.done();
                                         return true;
                                       }
                                       std::string chunk(1 << 16, 'x');
                                       return sink.write(chunk.data(), chunk.size());
                                     });
  });
  local.start();
  {
    Client client(parse_url(local.url()), fast_options());
    GetRequest request;
    request.path = "/big";
    request.headers = {{"X-Probe", "yes"}};
    request.stop_after_bytes = 100;
    HttpResponse response = client.get(request);
    EXPECT_EQ(response.status, 200);
    EXPECT_TRUE(response.body_cut);
    EXPECT_EQ(response.body.size(), 100u);
    EXPECT_EQ(range_seen, "yes");
    EXPECT_EQ(client.stats().retries, 0);
  }
  EXPECT_EQ(served.load(), 1);
}

}  // namespace
}  // namespace kvaudit::net
