#include "server/http_server.h"

#include <chrono>

#include "boost/asio/co_spawn.hpp"
#include "boost/asio/detached.hpp"
#include "boost/asio/post.hpp"
#include "boost/asio/redirect_error.hpp"
#include "boost/asio/strand.hpp"
#include "boost/asio/use_awaitable.hpp"
#include "server/api_error.h"
#include "spdlog/spdlog.h"

namespace lair::server {

using asio::ip::tcp;

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const ServerConfig& config,
                                                              Metrics* metrics, Handler handler) {
  std::unique_ptr<HttpServer> server(new HttpServer(config, metrics, std::move(handler)));
  beast::error_code ec;
  const std::string where = config.host + ":" + std::to_string(config.http_port);
  tcp::endpoint endpoint(asio::ip::make_address(config.host, ec),
                         static_cast<uint16_t>(config.http_port));
  if (ec)
    return absl::InvalidArgumentError("http: bad host '" + config.host + "': " + ec.message());
  tcp::acceptor& acceptor = server->acceptor_;
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return absl::UnavailableError("http: cannot listen on " + where + ": " + ec.message());
  server->port_ = acceptor.local_endpoint().port();
  asio::co_spawn(acceptor.get_executor(), server->Accept(), asio::detached);
  for (int i = 0; i < std::max(1, config.http_threads); ++i) {
    server->threads_.emplace_back([io = &server->io_] { io->run(); });
  }
  return server;
}

HttpServer::HttpServer(const ServerConfig& config, Metrics* metrics, Handler handler)
    : config_(config),
      metrics_(metrics),
      handler_(std::move(handler)),
      acceptor_(asio::make_strand(io_)) {}

HttpServer::~HttpServer() { Stop(absl::ZeroDuration()); }

void HttpServer::StopAccepting() {
  stopping_ = true;
  asio::post(acceptor_.get_executor(), [this] {
    beast::error_code ec;
    acceptor_.close(ec);
  });
}

void HttpServer::Stop(absl::Duration grace) {
  StopAccepting();
  const absl::Time deadline = absl::Now() + grace;
  while (in_flight_.load() > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  io_.stop();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

asio::awaitable<void> HttpServer::Accept() {
  while (true) {
    beast::error_code ec;
    tcp::socket socket = co_await acceptor_.async_accept(
        asio::make_strand(io_), asio::redirect_error(asio::use_awaitable, ec));
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) co_return;
    if (ec) {
      // Out of file descriptors and the like: back off instead of spinning.
      spdlog::warn("http: accept failed: {}", ec.message());
      asio::steady_timer pause(acceptor_.get_executor(), std::chrono::milliseconds(50));
      co_await pause.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      continue;
    }
    auto executor = socket.get_executor();
    asio::co_spawn(executor, Serve(std::move(socket)), asio::detached);
  }
}

// Reads and drops what the client still sends (bounded in bytes and time)
// after an early answer, so closing does not reset the connection before the
// client has read that answer.
asio::awaitable<void> HttpServer::Drain(beast::tcp_stream& stream) {
  constexpr size_t kMaxDrainBytes = size_t{64} << 20;
  beast::error_code ec;
  stream.socket().shutdown(tcp::socket::shutdown_send, ec);
  stream.expires_after(std::chrono::seconds(5));
  std::vector<char> scratch(64 << 10);
  for (size_t drained = 0; !ec && drained < kMaxDrainBytes;) {
    drained += co_await stream.async_read_some(asio::buffer(scratch),
                                               asio::redirect_error(asio::use_awaitable, ec));
  }
}

asio::awaitable<void> HttpServer::Serve(tcp::socket socket) {
  beast::tcp_stream stream(std::move(socket));
  beast::flat_buffer buffer;
  const auto idle = std::chrono::milliseconds(absl::ToInt64Milliseconds(config_.idle_timeout));
  while (!stopping_) {
    http::request_parser<http::string_body> parser;
    parser.body_limit(config_.max_body_bytes);
    beast::error_code ec;
    stream.expires_after(idle);
    // A Content-Length over the limit fails already here, with body_limit.
    co_await http::async_read_header(stream, buffer, parser,
                                     asio::redirect_error(asio::use_awaitable, ec));
    if (ec && ec != http::error::body_limit) break;
    if (!ec && parser.get()[http::field::expect] == "100-continue") {
      http::response<http::empty_body> go_on(http::status::continue_, parser.get().version());
      co_await http::async_write(stream, go_on, asio::redirect_error(asio::use_awaitable, ec));
      if (ec) break;
    }
    if (!ec)
      co_await http::async_read(stream, buffer, parser,
                                asio::redirect_error(asio::use_awaitable, ec));
    stream.expires_never();
    in_flight_.fetch_add(1);
    HttpExchange exchange(stream, buffer, parser.release(), metrics_);
    bool keep_alive = false;
    if (ec == http::error::body_limit) {
      absl::Status too_large = absl::InvalidArgumentError(
          "the request body exceeds " + std::to_string(config_.max_body_bytes) + " bytes");
      co_await exchange.Reply(http::status::payload_too_large, DumpJson(OpenAiErrorBody(too_large)),
                              "application/json");
      co_await Drain(stream);
    } else if (!ec) {
      co_await handler_(exchange);
      keep_alive = co_await exchange.Finish();
    }
    in_flight_.fetch_sub(1);
    if (!keep_alive) break;
  }
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
}

}  // namespace lair::server
