// The tests' one loopback HTTP server: an httplib server on 127.0.0.1 at an ephemeral (or
// given) port, serving from its own thread until destroyed. Register routes on `http` before
// start(). Declare whatever a handler captures before the server: its worker threads may
// still run a handler while the test's locals are being destroyed.
#pragma once

#include <httplib.h>

#include <chrono>
#include <string>
#include <thread>

namespace kvaudit::testing {

struct LoopbackServer {
  httplib::Server http;
  std::thread thread;
  int port = -1;

  // Binds (port 0: any free port) and serves; false when the port cannot be had.
  bool start(int wanted_port = 0) {
    port = wanted_port == 0 ? http.bind_to_any_port("127.0.0.1")
                            : (http.bind_to_port("127.0.0.1", wanted_port) ? wanted_port : -1);
    if (port <= 0) return false;
    thread = std::thread([this] { http.listen_after_bind(); });
    // A stop() before the accept loop runs would be lost and join() would hang.
    while (!http.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return true;
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port); }
  // Stops serving and joins the thread; again, or from the destructor, it does nothing.
  void stop() {
    http.stop();
    if (thread.joinable()) thread.join();
  }
  ~LoopbackServer() { stop(); }
};

}  // namespace kvaudit::testing
