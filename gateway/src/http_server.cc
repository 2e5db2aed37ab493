#include "http_server.h"

#include <array>
#include <atomic>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstdio>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace silt::gateway {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// What every connection of one server shares; kept alive by the connections
// themselves.
struct Shared {
  HttpServerOptions options;
  Handler handler;
};

// A handler's unexpected exception as a 500, with a log line.
HttpResponse InternalError(absl::string_view what, absl::string_view why) {
  fprintf(stderr, "silt-gateway: internal error serving %.*s: %.*s\n",
          static_cast<int>(what.size()), what.data(),
          static_cast<int>(why.size()), why.data());
  return HttpResponse::Text(500,
                            absl::StrCat("internal error serving ", what,
                                         " (the gateway logged it): ", why));
}

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket&& socket, std::shared_ptr<const Shared> shared)
      : stream_(std::move(socket)),
        shared_(std::move(shared)),
        options_(shared_->options),
        handler_(shared_->handler) {
    beast::error_code ec;
    auto ep = stream_.socket().remote_endpoint(ec);
    if (!ec) remote_ = FormatEndpoint(ep);
  }

  void Start() {
    asio::dispatch(stream_.get_executor(),
                   [self = shared_from_this()] { self->ReadHeader(); });
  }

 private:
  void ReadHeader() {
    upload_parser_.reset();
    upload_ = false;
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(options_.header_limit));
    parser_->body_limit(std::numeric_limits<uint64_t>::max());
    stream_.expires_after(options_.header_timeout);
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) {
          self->OnHeader(ec);
        });
  }

  void OnHeader(beast::error_code ec) {
    if (ec) return FailRead(ec);
    auto& req = parser_->get();
    absl::string_view target(req.target().data(), req.target().size());
    absl::string_view path = target.substr(0, target.find('?'));
    body_limit_ = options_.body_limit ? options_.body_limit(path)
                                      : std::numeric_limits<size_t>::max();
    if (auto len = parser_->content_length(); len && *len > body_limit_) {
      return SendAndClose(TooLarge());
    }
    parser_->body_limit(body_limit_);
    // A large or chunked body on a streaming route goes to the handler in
    // parts, as it arrives.
    upload_ = options_.streams && options_.streams(path) &&
              (parser_->chunked() ||
               parser_->content_length().value_or(0) > options_.stream_over);
    if (beast::iequals(req[http::field::expect], "100-continue")) {
      auto cont = std::make_shared<http::response<http::empty_body>>(
          http::status::continue_, req.version());
      stream_.expires_after(options_.write_timeout);
      http::async_write(
          stream_, *cont,
          [self = shared_from_this(), cont](beast::error_code ec, size_t) {
            if (ec) return self->Close();
            self->ReadBody();
          });
      return;
    }
    ReadBody();
  }

  // ---- a request body in parts (HttpRequest::body_rest) ----

  // The rest of the current request's body, read as the handler pulls it.
  // Its Pull and Cancel hop onto the connection's thread.
  struct Upload final : BodyStream {
    explicit Upload(std::shared_ptr<Session> s) : session(std::move(s)) {}
    void Pull(Next next) override {
      asio::post(session->stream_.get_executor(),
                 [s = session, next = std::move(next)]() mutable {
                   s->ReadPart(std::move(next));
                 });
    }
    void Cancel() override {
      asio::post(session->stream_.get_executor(), [s = session] {
        if (!s->upload_done_) s->upload_abandoned_ = true;
      });
    }
    const std::shared_ptr<Session> session;
  };

  void StartUpload() {
    upload_parser_.emplace(std::move(*parser_));
    upload_parser_->body_limit(body_limit_);
    upload_done_ = upload_abandoned_ = false;
    HttpRequest req = RequestOf(upload_parser_->get());
    req.body_rest = std::make_shared<Upload>(shared_from_this());
    Deliver(std::move(req));
  }

  void ReadPart(BodyStream::Next next) {
    if (upload_done_ || upload_abandoned_ || !upload_parser_)
      return next(absl::FailedPreconditionError("the request body is over"));
    part_in_.resize(kUploadPart);
    auto& body = upload_parser_->get().body();
    body.data = part_in_.data();
    body.size = part_in_.size();
    body.more = true;
    upload_reading_ = true;
    stream_.expires_after(options_.body_timeout);
    http::async_read_some(stream_, buffer_, *upload_parser_,
                          [self = shared_from_this(), next = std::move(next)](
                              beast::error_code ec, size_t) mutable {
                            self->OnPart(ec, std::move(next));
                          });
  }

  void OnPart(beast::error_code ec, BodyStream::Next next) {
    upload_reading_ = false;
    if (ec == http::error::need_buffer) ec = {};
    if (ec) {
      upload_abandoned_ = true;
      if (ec == http::error::body_limit)
        return next(absl::OutOfRangeError(
            absl::StrCat("request body too large: the limit for this route is ",
                         body_limit_, " bytes")));
      return next(absl::CancelledError(
          absl::StrCat("the request body broke off: ", ec.message())));
    }
    size_t got = part_in_.size() - upload_parser_->get().body().size;
    bool last = upload_parser_->is_done();
    if (got == 0 && !last) return ReadPart(std::move(next));
    if (last) upload_done_ = true;
    stream_.expires_never();
    next(BodyStream::Part{std::string(part_in_.data(), got), last});
  }

  // Whether the connection can read the next request once this one is
  // answered (its body is read to the end).
  bool BodyConsumed() const { return !upload_ || upload_done_; }

  void ReadBody() {
    if (upload_) return StartUpload();
    stream_.expires_after(options_.body_timeout);
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       self->OnBody(ec);
                     });
  }

  void OnBody(beast::error_code ec) {
    if (ec == http::error::body_limit) return SendAndClose(TooLarge());
    if (ec) return FailRead(ec);
    stream_.expires_never();
    HttpRequest req = RequestOf(parser_->get());
    req.body = std::move(parser_->get().body());
    parser_.reset();
    Deliver(std::move(req));
  }

  // The request's head, as the handler gets it; notes what the answer needs.
  template <typename Message>
  HttpRequest RequestOf(const Message& msg) {
    HttpRequest req;
    req.method = std::string(msg.method_string());
    req.target = std::string(msg.target());
    size_t q = req.target.find('?');
    req.path = req.target.substr(0, q);
    if (q != std::string::npos) req.query = req.target.substr(q + 1);
    for (const auto& f : msg) {
      req.headers.emplace_back(std::string(f.name_string()),
                               std::string(f.value()));
    }
    req.remote = remote_;
    req.version = msg.version();
    keep_alive_ = msg.keep_alive();
    version_ = msg.version();
    head_ = msg.method() == http::verb::head;
    return req;
  }

  void Deliver(HttpRequest req) {
    // The handler may answer from any thread: hop back onto this connection's
    // thread. It answers once; an exception it lets out is answered with 500
    // here (the last line of defence: never an abort of the daemon).
    // One request at a time per connection (the next is read once this one
    // is answered): the flag and the buffer are reused across requests.
    answered_ = false;
    what_.assign(req.method).append(" ").append(req.path);
    Reply reply = [self = shared_from_this()](HttpResponse res) {
      if (self->answered_.exchange(true)) return;
      asio::dispatch(self->stream_.get_executor(),
                     [self, res = std::move(res)]() mutable {
                       self->Write(std::move(res), self->keep_alive_);
                     });
    };
    try {
      handler_(std::move(req), reply);
    } catch (const std::exception& e) {
      reply(InternalError(what_, e.what()));
    } catch (...) {
      reply(InternalError(what_, "unknown exception"));
    }
  }

  void FailRead(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == asio::error::eof ||
        ec == beast::error::timeout || ec == asio::error::operation_aborted ||
        ec == asio::error::connection_reset) {
      return Close();
    }
    if (ec.category() ==
            http::make_error_code(http::error::bad_target).category() ||
        ec == http::error::header_limit) {
      // Malformed or oversized request head: answer once, close only this
      // connection.
      int status = ec == http::error::header_limit ? 431 : 400;
      return SendAndClose(HttpResponse::Text(
          status, absl::StrCat("malformed HTTP request: ", ec.message())));
    }
    Close();
  }

  HttpResponse TooLarge() const {
    return HttpResponse::Text(
        413,
        absl::StrCat("request body too large: the limit for this route is ",
                     body_limit_, " bytes"));
  }

  void SendAndClose(HttpResponse res) {
    parser_.reset();
    Write(std::move(res), /*keep_alive=*/false);
  }

  void Write(HttpResponse res, bool keep_alive) {
    // An answer before the body was read to its end (an error, or a function
    // that ignored it) ends the connection after it.
    if (!BodyConsumed()) keep_alive = false;
    if (res.stream) return Stream(std::move(res));
    if (res.parts) return WriteHead(std::move(res), keep_alive);
    if (WriteWhole(res, keep_alive)) return;
    auto msg = std::make_shared<http::response<http::string_body>>();
    msg->version(version_);
    msg->result(static_cast<unsigned>(res.status));
    for (auto& [k, v] : res.headers) msg->insert(k, v);
    msg->body() = std::move(res.body);
    msg->keep_alive(keep_alive);
    msg->prepare_payload();
    if (head_)
      msg->body().clear();  // Content-Length stays that of the GET body.
    stream_.expires_after(options_.write_timeout);
    http::async_write(
        stream_, *msg,
        [self = shared_from_this(), msg, keep_alive](
            beast::error_code ec, size_t) { self->Written(ec, keep_alive); });
  }

  // A whole response is out (or failed): the next request, or the end.
  void Written(beast::error_code ec, bool keep_alive) {
    if (ec) return Close();
    if (!keep_alive) return LingeringClose();
    head_ = false;
    ReadHeader();
  }

  // A whole response as one gather write of its head (formatted here) and
  // its body: what Beast's serializer would send, without its cost per
  // call. False (nothing sent) for what only the serializer handles: a
  // status without a body or a reason phrase, a head that sets its own
  // framing or connection, a name or value that would break the head.
  bool WriteWhole(HttpResponse& res, bool keep_alive) {
    const auto status = http::int_to_status(static_cast<unsigned>(res.status));
    if (status == http::status::unknown || res.status < 200 ||
        res.status == 204 || res.status == 304)
      return false;
    const beast::string_view reason = http::obsolete_reason(status);
    head_out_.clear();
    absl::StrAppend(&head_out_, version_ == 10 ? "HTTP/1.0 " : "HTTP/1.1 ",
                    res.status, " ",
                    absl::string_view(reason.data(), reason.size()), "\r\n");
    for (const auto& [k, v] : res.headers) {
      if (k.empty() || beast::iequals(k, "Content-Length") ||
          beast::iequals(k, "Transfer-Encoding") ||
          beast::iequals(k, "Connection") ||
          k.find_first_of("\r\n:") != std::string::npos ||
          v.find_first_of("\r\n") != std::string::npos)
        return false;
      absl::StrAppend(&head_out_, k, ": ", v, "\r\n");
    }
    absl::StrAppend(&head_out_, "Content-Length: ", res.body.size(), "\r\n");
    if (keep_alive && version_ == 10)
      head_out_.append("Connection: keep-alive\r\n");
    if (!keep_alive && version_ != 10)
      head_out_.append("Connection: close\r\n");
    head_out_.append("\r\n");
    body_out_ = std::move(res.body);
    if (head_) body_out_.clear();  // Content-Length stays that of the GET body
    const std::array<asio::const_buffer, 2> out{asio::buffer(head_out_),
                                                asio::buffer(body_out_)};
    stream_.expires_after(options_.write_timeout);
    asio::async_write(
        stream_, out,
        [self = shared_from_this(), keep_alive](beast::error_code ec, size_t) {
          if (self->body_out_.capacity() > (64 << 10))
            std::string().swap(self->body_out_);
          self->Written(ec, keep_alive);
        });
    return true;
  }

  // Sends the head, then the chunks `res.stream` produces on its own thread (it
  // may block for long, e.g. following logs), then closes the connection.
  void Stream(HttpResponse res) {
    http::response<http::empty_body> head;
    head.version(version_);
    head.result(static_cast<unsigned>(res.status));
    for (auto& [k, v] : res.headers) head.insert(k, v);
    head.chunked(true);
    head.keep_alive(false);
    stream_.expires_never();
    std::thread([self = shared_from_this(), head = std::move(head),
                 produce = std::move(res.stream)]() mutable {
      beast::error_code ec;
      http::response_serializer<http::empty_body> sr{head};
      http::write_header(self->stream_, sr, ec);
      if (!ec) {
        try {
          produce([&](absl::string_view chunk) {
            if (ec) return false;
            if (chunk.empty()) return true;
            asio::write(
                self->stream_,
                http::make_chunk(asio::buffer(chunk.data(), chunk.size())), ec);
            return !ec;
          });
        } catch (const std::exception& e) {
          // The head is out: end the body early (the client sees a truncated
          // stream) and say why in the log.
          InternalError("a streamed response", e.what());
        }
      }
      if (!ec) asio::write(self->stream_, http::make_chunk_last(), ec);
      asio::post(self->stream_.get_executor(), [self] { self->Close(); });
    }).detach();
  }

  // A body in parts (HttpResponse::parts): the head, then each part as it
  // comes, chunked (HTTP/1.1: the connection stays) or delimited by closing
  // the connection (HTTP/1.0). One write at a time, then the next Pull.
  void WriteHead(HttpResponse res, bool keep_alive) {
    chunked_ = version_ >= 11;
    parts_keep_alive_ = keep_alive && chunked_;
    parts_ = std::move(res.parts);
    part_ = std::move(res.body);
    auto head = std::make_shared<http::response<http::empty_body>>();
    head->version(version_);
    head->result(static_cast<unsigned>(res.status));
    for (auto& [k, v] : res.headers) head->insert(k, v);
    if (chunked_) head->chunked(true);
    head->keep_alive(parts_keep_alive_);
    auto sr =
        std::make_shared<http::response_serializer<http::empty_body>>(*head);
    stream_.expires_after(options_.write_timeout);
    http::async_write_header(
        stream_, *sr,
        [self = shared_from_this(), head, sr](beast::error_code ec, size_t) {
          if (ec) return self->EndParts(/*client_gone=*/true);
          if (self->head_) {  // no body for HEAD: the head said it all
            self->parts_->Cancel();
            return self->EndParts(false);
          }
          // (The client's connection is watched once its body is in.)
          if (self->BodyConsumed()) self->WatchClient();
          self->WritePart(/*last=*/false);
        });
  }

  // Writes part_ (nothing when empty), then the last chunk if `last`.
  void WritePart(bool last) {
    auto after = [self = shared_from_this(), last](beast::error_code ec,
                                                   size_t) {
      if (ec) return self->EndParts(/*client_gone=*/true);
      if (!last) return self->PullPart();
      if (!self->chunked_) return self->EndParts(false);
      self->stream_.expires_after(self->options_.write_timeout);
      asio::async_write(self->stream_, http::make_chunk_last(),
                        [self](beast::error_code ec, size_t) {
                          self->EndParts(/*client_gone=*/bool(ec));
                        });
    };
    if (part_.empty()) return after({}, 0);
    stream_.expires_after(options_.write_timeout);
    if (chunked_) {
      asio::async_write(stream_, http::make_chunk(asio::buffer(part_)),
                        std::move(after));
    } else {
      asio::async_write(stream_, asio::buffer(part_), std::move(after));
    }
  }

  void PullPart() {
    stream_.expires_never();  // a function may write its next part much later
    parts_->Pull([self = shared_from_this()](
                     absl::StatusOr<BodyStream::Part> part) mutable {
      asio::dispatch(self->stream_.get_executor(),
                     [self, part = std::move(part)]() mutable {
                       if (!part.ok()) {
                         // Cut short: no last chunk, and the connection
                         // closes, so that the client sees the body broke off.
                         fprintf(stderr,
                                 "silt-gateway: %s: the body broke off: %s\n",
                                 self->what_.c_str(),
                                 std::string(part.status().message()).c_str());
                         self->parts_.reset();
                         return self->Close();
                       }
                       self->part_ = std::move(part->bytes);
                       // The body is over: nothing more is asked of it (its
                       // connection may carry another call by now).
                       if (part->last) self->parts_.reset();
                       self->WritePart(part->last);
                     });
    });
  }

  // While parts are awaited, a read on the client's connection notices it
  // closing (and cancels the body, which ends the function's call); bytes
  // that arrive meanwhile (a pipelined request) stay in buffer_ for later.
  void WatchClient() {
    watching_ = true;
    stream_.socket().async_read_some(
        buffer_.prepare(4096),
        [self = shared_from_this()](beast::error_code ec, size_t n) {
          self->watching_ = false;
          if (!ec) self->buffer_.commit(n);
          if (self->after_watch_)
            return std::exchange(self->after_watch_, {})();
          if (ec && self->parts_) return self->parts_->Cancel();
          if (!ec && self->parts_ && self->buffer_.size() < (64 << 10))
            self->WatchClient();
        });
  }

  void EndParts(bool client_gone) {
    if (client_gone && parts_) parts_->Cancel();
    parts_.reset();
    std::string().swap(part_);
    if (client_gone || !parts_keep_alive_) return Close();
    head_ = false;
    if (!watching_) return ReadHeader();
    // The next request is read once the watch is off the socket.
    after_watch_ = [self = shared_from_this()] { self->ReadHeader(); };
    beast::error_code ec;
    stream_.socket().cancel(ec);
  }

  // Half-closes, then reads and discards what the client still sends (the rest
  // of a body we refused) until it closes or a deadline passes, so that the
  // client gets to read our answer instead of a connection reset.
  void LingeringClose() {
    if (upload_reading_) return Close();  // the read pending is the body's
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    if (ec) return Close();
    stream_.expires_after(std::chrono::seconds(5));
    Drain();
  }

  void Drain() {
    drain_.resize(64 * 1024);
    stream_.async_read_some(
        asio::buffer(drain_),
        [self = shared_from_this()](beast::error_code ec, size_t) {
          if (ec) return self->Close();
          self->Drain();
        });
  }

  void Close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.socket().close(ec);
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  // The current request's body in parts (StartUpload), read into part_in_.
  static constexpr size_t kUploadPart = 256 << 10;
  std::optional<http::request_parser<http::buffer_body>> upload_parser_;
  std::string part_in_;
  bool upload_ = false;            // the current request's body streams
  bool upload_done_ = false;       // ... and was read to its end
  bool upload_abandoned_ = false;  // ... or broke off, or is not wanted
  bool upload_reading_ = false;    // a read of it is pending
  std::shared_ptr<const Shared> shared_;
  const HttpServerOptions& options_;
  const Handler& handler_;
  std::string remote_;
  std::vector<char> drain_;
  std::atomic<bool> answered_{false};  // the current request has its reply
  std::string what_;                   // its "METHOD PATH", for error logs
  std::string head_out_, body_out_;    // a whole response being written
  // A body in parts being sent (WriteHead), and the part being written.
  std::shared_ptr<BodyStream> parts_;
  std::string part_;
  bool chunked_ = false, parts_keep_alive_ = false;
  bool watching_ = false;              // WatchClient's read is pending
  std::function<void()> after_watch_;  // what runs once it ends
  size_t body_limit_ = 0;
  bool keep_alive_ = true;
  bool head_ = false;
  unsigned version_ = 11;
};

}  // namespace

struct HttpServer::Listener : std::enable_shared_from_this<Listener> {
  Listener(const std::vector<asio::io_context*>& contexts, HttpServerOptions o,
           Handler h)
      : contexts(contexts),
        acceptor(asio::make_strand(*contexts[0])),
        shared(std::make_shared<Shared>(Shared{std::move(o), std::move(h)})) {}

  void Accept() {
    asio::io_context& ioc = *contexts[next++ % contexts.size()];
    // A connection needs no strand: each context runs on one thread.
    acceptor.async_accept(ioc, [self = shared_from_this()](beast::error_code ec,
                                                           tcp::socket socket) {
      if (ec == asio::error::operation_aborted || !self->acceptor.is_open())
        return;
      if (!ec) {
        socket.set_option(tcp::no_delay(true), ec);
        std::make_shared<Session>(std::move(socket), self->shared)->Start();
      }
      self->Accept();
    });
  }

  const std::vector<asio::io_context*> contexts;
  size_t next = 0;  // on the acceptor's strand
  tcp::acceptor acceptor;
  std::shared_ptr<const Shared> shared;
};

absl::StatusOr<tcp::endpoint> ParseListenAddress(absl::string_view addr) {
  size_t colon = addr.rfind(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "listen address \"", addr, "\" must be ADDR:PORT, :PORT or [V6]:PORT"));
  }
  absl::string_view host = addr.substr(0, colon);
  uint32_t port = 0;
  if (!absl::SimpleAtoi(addr.substr(colon + 1), &port) || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address \"", addr, "\": bad port"));
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (host.empty()) host = "0.0.0.0";
  if (host == "localhost") host = "127.0.0.1";
  beast::error_code ec;
  auto ip = asio::ip::make_address(std::string(host), ec);
  if (ec) {
    return absl::InvalidArgumentError(absl::StrCat(
        "listen address \"", addr, "\": \"", host, "\" is not an IP address"));
  }
  return tcp::endpoint(ip, static_cast<uint16_t>(port));
}

std::string FormatEndpoint(const tcp::endpoint& ep) {
  if (ep.address().is_v6())
    return absl::StrCat("[", ep.address().to_string(), "]:", ep.port());
  return absl::StrCat(ep.address().to_string(), ":", ep.port());
}

HttpServer::HttpServer(std::shared_ptr<Listener> l) : listener_(std::move(l)) {}
HttpServer::~HttpServer() { Close(); }

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Listen(
    const std::vector<asio::io_context*>& contexts, absl::string_view listen,
    HttpServerOptions options, Handler handler) {
  if (contexts.empty())
    return absl::InvalidArgumentError("an HTTP server needs an io_context");
  auto ep = ParseListenAddress(listen);
  if (!ep.ok()) return ep.status();
  auto l = std::make_shared<Listener>(contexts, std::move(options),
                                      std::move(handler));
  beast::error_code ec;
  l->acceptor.open(ep->protocol(), ec);
  if (!ec) l->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) l->acceptor.bind(*ep, ec);
  if (!ec) l->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen, ": ", ec.message()));
  }
  l->Accept();
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(l)));
}

tcp::endpoint HttpServer::local_endpoint() const {
  beast::error_code ec;
  return listener_->acceptor.local_endpoint(ec);
}

void HttpServer::Close() {
  asio::post(listener_->acceptor.get_executor(), [l = listener_] {
    beast::error_code ec;
    l->acceptor.close(ec);
  });
}

}  // namespace silt::gateway
