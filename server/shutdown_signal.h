// Waiting for SIGINT or SIGTERM. The handler only records the signal and
// posts a semaphore (both async-signal-safe); the shutdown itself runs as
// ordinary code in the thread that waits. Whichever thread the kernel picks
// to take the signal (library threads included), the effect is the same.
#pragma once

namespace lair::server {

// Installs the SIGINT and SIGTERM handlers. Call once, early in main.
void InstallTerminationHandlers();

// Waits for SIGINT or SIGTERM and returns its number.
// REQUIRES: InstallTerminationHandlers was called.
int WaitForTerminationSignal();

}  // namespace lair::server
