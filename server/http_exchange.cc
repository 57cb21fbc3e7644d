#include "server/http_exchange.h"

#include "boost/asio/post.hpp"
#include "boost/asio/redirect_error.hpp"
#include "boost/asio/use_awaitable.hpp"
#include "server/api_error.h"

namespace lair::server {
namespace {
constexpr size_t kWatchBytes = 4096;
}  // namespace

Notifier::Notifier(const asio::any_io_executor& strand) : state_(std::make_shared<State>(strand)) {}

void Notifier::Notify() const {
  asio::post(state_->timer.get_executor(), [state = state_] {
    state->pending = true;
    state->timer.cancel();
  });
}

asio::awaitable<void> Notifier::Wait() const {
  std::shared_ptr<State> state = state_;
  if (!state->pending) {
    state->timer.expires_at(asio::steady_timer::time_point::max());
    beast::error_code ec;
    co_await state->timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
  state->pending = false;
}

HttpExchange::HttpExchange(beast::tcp_stream& stream, beast::flat_buffer& buffer,
                           HttpRequest request, Metrics* metrics)
    : stream_(stream),
      buffer_(buffer),
      request_(std::move(request)),
      metrics_(metrics),
      notifier_(stream.get_executor()) {}

std::string_view HttpExchange::path() const {
  std::string_view target(request_.target().data(), request_.target().size());
  return target.substr(0, target.find('?'));
}

void HttpExchange::WatchForDisconnect() {
  watching_ = true;
  stream_.async_read_some(buffer_.prepare(kWatchBytes), [this](beast::error_code ec, size_t n) {
    buffer_.commit(n);
    watch_done_ = true;
    // operation_aborted is Finish cancelling the watch; data (n > 0) is a
    // pipelined request left in the buffer for the connection to parse.
    if (ec && ec != asio::error::operation_aborted) client_gone_ = true;
    notifier_.Notify();
  });
}

void HttpExchange::Record(http::status status) {
  replied_ = true;
  metrics_->RecordResponse("http", std::to_string(static_cast<int>(status)));
}

template <class Message>
void HttpExchange::Prepare(Message& message, http::status status,
                           std::string_view content_type) const {
  message.result(status);
  message.version(request_.version());
  message.set(http::field::server, "lair");
  message.set(http::field::content_type, std::string(content_type));
  message.keep_alive(request_.keep_alive());
}

asio::awaitable<void> HttpExchange::Reply(http::status status, std::string body,
                                          std::string_view content_type) {
  http::response<http::string_body> response;
  Prepare(response, status, content_type);
  response.body() = std::move(body);
  response.prepare_payload();
  Record(status);
  beast::error_code ec;
  co_await http::async_write(stream_, response, asio::redirect_error(asio::use_awaitable, ec));
  if (ec) client_gone_ = true;
}

asio::awaitable<void> HttpExchange::ReplyError(const absl::Status& status) {
  co_await Reply(static_cast<http::status>(HttpStatusFor(status)),
                 DumpJson(OpenAiErrorBody(status)), "application/json");
}

asio::awaitable<bool> HttpExchange::BeginStream() {
  http::response<http::empty_body> response;
  Prepare(response, http::status::ok, "text/event-stream");
  response.set(http::field::cache_control, "no-cache");
  response.chunked(true);
  Record(http::status::ok);
  http::response_serializer<http::empty_body> serializer(response);
  beast::error_code ec;
  co_await http::async_write_header(stream_, serializer,
                                    asio::redirect_error(asio::use_awaitable, ec));
  if (ec) client_gone_ = true;
  co_return !client_gone_;
}

asio::awaitable<bool> HttpExchange::Send(std::string data) {
  if (client_gone_) co_return false;
  beast::error_code ec;
  co_await asio::async_write(stream_, http::make_chunk(asio::buffer(data)),
                             asio::redirect_error(asio::use_awaitable, ec));
  if (ec) client_gone_ = true;
  co_return !client_gone_;
}

asio::awaitable<void> HttpExchange::EndStream() {
  if (client_gone_) co_return;
  beast::error_code ec;
  co_await asio::async_write(stream_, http::make_chunk_last(),
                             asio::redirect_error(asio::use_awaitable, ec));
  if (ec) client_gone_ = true;
}

asio::awaitable<bool> HttpExchange::Finish() {
  if (watching_ && !watch_done_) {
    beast::error_code ec;
    stream_.socket().cancel(ec);
    while (!watch_done_) co_await notifier_.Wait();
  }
  co_return replied_ && !client_gone_ && request_.keep_alive();
}

}  // namespace lair::server
