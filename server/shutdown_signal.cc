#include "server/shutdown_signal.h"

#include <semaphore.h>
#include <signal.h>

#include <cerrno>

namespace lair::server {
namespace {

sem_t termination;                      // posted by the handler
volatile sig_atomic_t last_signal = 0;  // the signal that posted it

void OnTerminationSignal(int signal) {
  last_signal = signal;
  sem_post(&termination);
}

}  // namespace

void InstallTerminationHandlers() {
  sem_init(&termination, 0, 0);
  struct sigaction action = {};
  action.sa_handler = OnTerminationSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

int WaitForTerminationSignal() {
  while (sem_wait(&termination) != 0 && errno == EINTR) {
  }
  return last_signal;
}

}  // namespace lair::server
