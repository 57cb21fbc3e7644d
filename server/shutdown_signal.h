// Waiting for SIGINT or SIGTERM without a signal handler: the signals are
// blocked in every thread and one thread takes them with sigwait, so the
// shutdown runs as ordinary code rather than in a handler.
#pragma once

namespace lair::server {

// Blocks SIGINT and SIGTERM in the calling thread and every thread it
// starts afterwards. REQUIRES: called before any other thread is started.
void BlockTerminationSignals();

// Waits for SIGINT or SIGTERM and returns its number.
// REQUIRES: BlockTerminationSignals was called.
int WaitForTerminationSignal();

}  // namespace lair::server
