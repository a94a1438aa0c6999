// The stop signals of the long-running commands (serve, watch): delivered to one waiting
// thread instead of interrupting whichever thread runs, so a command stops where it chooses.
#include <pthread.h>

#include <csignal>

#include "cli/commands.h"

namespace kvaudit::cli {

namespace {

sigset_t stop_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGUSR1);  // internal: wakes the waiter when the command ends otherwise
  return signals;
}

}  // namespace

void block_stop_signals() {
  const sigset_t signals = stop_signals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

StopSignalWaiter::StopSignalWaiter(std::function<void()> on_stop)
    : thread_([on_stop = std::move(on_stop)] {
        const sigset_t signals = stop_signals();
        int received = 0;
        sigwait(&signals, &received);
        on_stop();  // on SIGUSR1 too: the command is ending anyway
      }) {}

StopSignalWaiter::~StopSignalWaiter() {
  pthread_kill(thread_.native_handle(), SIGUSR1);
  thread_.join();
}

}  // namespace kvaudit::cli
