// HttpExchange: one HTTP request and its response as a handler sees them,
// over Boost.Beast. Handlers are Asio coroutines running on the
// connection's strand; they reply once (Reply/ReplyError) or stream
// (BeginStream, Send..., EndStream).
//
// Disconnects: WatchForDisconnect keeps a read pending on the socket while a
// long request runs, so a client that closes is noticed even when nothing
// is being written; client_gone() turns true and the Notifier fires.
//
// Thread safety: an exchange is used on its connection's strand only,
// except Notifier::Notify, which any thread may call.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>  // Boost 1.74's awaitable.hpp uses std::exchange without including it

#include "boost/asio/awaitable.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "core/status.h"
#include "server/metrics.h"

namespace lair::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using HttpRequest = http::request<http::string_body>;

// Wakes a coroutine on a strand from any thread. Copies share one state.
class Notifier {
 public:
  explicit Notifier(const asio::any_io_executor& strand);
  // Any thread. The next (or current) Wait returns.
  void Notify() const;
  // REQUIRES: on the strand. Returns once a Notify happened since the last Wait.
  asio::awaitable<void> Wait() const;

 private:
  struct State {
    explicit State(const asio::any_io_executor& strand) : timer(strand) {}
    asio::steady_timer timer;  // waited on until cancelled by Notify
    bool pending = false;      // a Notify not yet consumed by Wait
  };
  std::shared_ptr<State> state_;
};

class HttpExchange {
 public:
  // `stream` and `buffer` are the connection's and outlive the exchange.
  HttpExchange(beast::tcp_stream& stream, beast::flat_buffer& buffer, HttpRequest request,
               Metrics* metrics);
  HttpExchange(const HttpExchange&) = delete;
  HttpExchange& operator=(const HttpExchange&) = delete;

  const HttpRequest& request() const { return request_; }
  std::string_view path() const;  // the target without its query string
  const Notifier& notifier() const { return notifier_; }
  bool client_gone() const { return client_gone_; }

  // Starts a read that completes when the peer closes (or sends more).
  // REQUIRES: not yet watching; no response written yet.
  void WatchForDisconnect();

  // Sends a whole response. Records it in the metrics.
  asio::awaitable<void> Reply(http::status status, std::string body, std::string_view content_type);
  // Sends OpenAI's error body with the status's HTTP code.
  asio::awaitable<void> ReplyError(const absl::Status& status);
  // Sends 200 headers for a chunked text/event-stream. False when the client is gone.
  asio::awaitable<bool> BeginStream();
  // Sends one chunk. False when the client is gone.
  asio::awaitable<bool> Send(std::string data);
  // Sends the final empty chunk.
  asio::awaitable<void> EndStream();

  // Stops the disconnect watch and waits for it to end. True when the
  // connection may carry another request.
  asio::awaitable<bool> Finish();

 private:
  void Record(http::status status);
  template <class Message>
  void Prepare(Message& message, http::status status, std::string_view content_type) const;

  beast::tcp_stream& stream_;
  beast::flat_buffer& buffer_;  // the connection's read buffer; the watch appends what it reads
  const HttpRequest request_;
  Metrics* const metrics_;
  Notifier notifier_;
  bool watching_ = false;     // a watch read was started
  bool watch_done_ = false;   // ... and has completed
  bool client_gone_ = false;  // the peer closed or a write failed
  bool replied_ = false;      // a response (or stream header) was sent
};

}  // namespace lair::server
