// Helpers for the serve tests: fixture checkpoints derived from the trained qwen3-pystd model
// (hard links + an hf_quant_config.json and/or a shard of KV scale tensors), and a server
// running on a loopback port in a background thread.
#pragma once

#include <httplib.h>

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/registry.h"
#include "serve/serve.h"

namespace kvaudit::serve::testing {

namespace fs = std::filesystem;
using nlohmann::json;

inline fs::path fixture_model() {
  return fs::path(KVAUDIT_TEST_DIR) / "fixtures" / "model" / "qwen3-pystd";
}

// A private copy of the fixture model (files hard-linked or copied) that a test may extend.
class TempModel {
 public:
  TempModel() {
    static int counter = 0;
    dir_ = fs::temp_directory_path() /
           ("kvaudit-serve-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::create_directories(dir_);
    for (const auto& entry : fs::directory_iterator(fixture_model())) {
      std::error_code ec;
      fs::create_hard_link(entry.path(), dir_ / entry.path().filename(), ec);
      if (ec) fs::copy_file(entry.path(), dir_ / entry.path().filename());
    }
  }
  ~TempModel() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  const fs::path& dir() const { return dir_; }

  void declare_fp8_kv() {
    std::ofstream(dir_ / "hf_quant_config.json")
        << R"({"producer": {"name": "modelopt", "version": "0.29.0"},
               "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}})";
  }
  // Writes an extra shard of F32 tensors: name -> values (one value: a scalar, shape []).
  void write_scales(const std::map<std::string, std::vector<float>>& tensors) {
    json header = json::object();
    std::string data;
    for (const auto& [name, values] : tensors) {
      json shape = values.size() == 1 ? json::array() : json::array({values.size()});
      header[name] = {{"dtype", "F32"},
                      {"shape", shape},
                      {"data_offsets", {data.size(), data.size() + 4 * values.size()}}};
      data.append(reinterpret_cast<const char*>(values.data()), 4 * values.size());
    }
    std::string text = header.dump();
    while (text.size() % 8) text += ' ';
    uint64_t length = text.size();
    std::ofstream out(dir_ / "kv_scales.safetensors", std::ios::binary);
    out.write(reinterpret_cast<const char*>(&length), 8);
    out << text << data;
  }

 private:
  fs::path dir_;
};

// A server on 127.0.0.1:<free port>, run() on a background thread; stopped when destroyed.
class RunningServer {
 public:
  explicit RunningServer(ServeOptions options) {
    options.port = 0;
    options.host = "127.0.0.1";
    server_ = std::make_unique<Server>(kvaudit::testing::registry(), options,
                                       [this](std::string_view line) {
                                         std::lock_guard<std::mutex> lock(mutex_);
                                         log_.emplace_back(line);
                                       });
    port_ = server_->bind();
    thread_ = std::thread([this] { server_->run(); });
  }
  ~RunningServer() { stop(); }
  void stop() {
    if (!thread_.joinable()) return;
    server_->stop();
    thread_.join();
  }
  int port() const { return port_; }
  Server& server() { return *server_; }
  std::vector<std::string> log() {
    std::lock_guard<std::mutex> lock(mutex_);
    return log_;
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120, 0);
    return c;
  }
  // POSTs JSON; returns {status, parsed body (null if not JSON)}.
  std::pair<int, json> post(const std::string& path, const json& body) const {
    auto c = client();
    auto res = c.Post(path.c_str(), body.dump(), "application/json");
    if (!res) return {-1, json()};
    return {res->status, json::parse(res->body, nullptr, false)};
  }
  std::pair<int, std::string> get(const std::string& path) const {
    auto c = client();
    auto res = c.Get(path.c_str());
    if (!res) return {-1, ""};
    return {res->status, res->body};
  }

 private:
  std::unique_ptr<Server> server_;
  std::thread thread_;
  int port_ = -1;
  std::mutex mutex_;
  std::vector<std::string> log_;
};

// Waits (bounded: 4 s) until /metrics shows a request running; false if none ever did.
inline bool wait_until_running(const RunningServer& server,
                               const std::string& model = "qwen3-pystd") {
  const std::string running = "vllm:num_requests_running{model_name=\"" + model + "\"} 1";
  for (int i = 0; i < 2000; ++i) {
    if (server.get("/metrics").second.find(running) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

inline ServeOptions options_for(const fs::path& model, const std::string& kv = "auto") {
  ServeOptions options;
  options.model_dir = model;
  options.kv_cache_dtype = kv;
  options.compute_threads = 2;
  options.http_threads = 16;
  return options;
}

}  // namespace kvaudit::serve::testing
