// HttpServer: HTTP/1.1 transport on Boost.Beast + Asio. Each connection is
// one coroutine on its own strand (so thousands of idle or streaming
// connections cost no threads); a small pool of threads runs the
// io_context. Each request becomes an HttpExchange passed to the handler.
//
// Lifecycle: Start binds and begins accepting; StopAccepting closes the
// listening socket; Stop waits (bounded) for requests in flight, then stops
// the threads, which closes every connection.
//
// Thread safety: StopAccepting, Stop and port may be called from any thread.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <utility>  // Boost 1.74's awaitable.hpp uses std::exchange without including it
#include <vector>

#include "boost/asio/awaitable.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "server/http_exchange.h"
#include "server/metrics.h"
#include "server/server_config.h"

namespace lair::server {

class HttpServer {
 public:
  using Handler = std::function<asio::awaitable<void>(HttpExchange&)>;

  // Binds config.host:config.http_port (Unavailable naming the address when
  // it cannot) and starts config.http_threads I/O threads. `metrics` must
  // outlive the server.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const ServerConfig& config,
                                                           Metrics* metrics, Handler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }
  void StopAccepting();
  // Waits up to `grace` for requests in flight, then stops. Idempotent.
  void Stop(absl::Duration grace);

 private:
  HttpServer(const ServerConfig& config, Metrics* metrics, Handler handler);
  asio::awaitable<void> Accept();
  asio::awaitable<void> Serve(asio::ip::tcp::socket socket);
  static asio::awaitable<void> Drain(beast::tcp_stream& stream);

  const ServerConfig config_;
  Metrics* const metrics_;
  const Handler handler_;
  asio::io_context io_;
  asio::ip::tcp::acceptor acceptor_;  // used on its own strand after Start
  int port_ = 0;
  std::vector<std::thread> threads_;
  std::atomic<int> in_flight_ = 0;      // requests read but not yet answered
  std::atomic<bool> stopping_ = false;  // no new requests on open connections
};

}  // namespace lair::server
