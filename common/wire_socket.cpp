// The TCP side of wire.h: FrameConnection and FrameListener over standalone Asio.
// Deadlines: every operation is an Asio async op on the connection's own io_context,
// run with run_for() in slices of at most kSlice until it completes, its deadline
// passes or a stop flag rises; then it is cancelled and the socket closed.
#include "common/wire.h"

#ifndef ASIO_STANDALONE
#define ASIO_STANDALONE
#endif
#include <asio.hpp>

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <utility>

namespace charm {

struct FrameConnection::Impl {
  asio::io_context io;
  asio::ip::tcp::socket socket{io};
  // Guards the descriptor against being closed (and its number reused) while abort()
  // shuts it down from another thread.
  std::mutex close_mutex;
  std::atomic<bool> aborted{false};
  std::atomic<bool> interrupted{false};  // set by interrupt() from any thread
  bool busy = false;  // a read or write is pending; touched on the owner's thread only
  // set_read_while_sending: frames read during a send, returned by the next receives,
  // and the error that ended such a read (raised by the receive after them). Owner only.
  bool read_while_sending = false;
  std::deque<FrameBody> inbox;
  std::exception_ptr read_error;
};

struct FrameListener::Impl {
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor{io};
};

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kSlice{100};

Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  // Treat anything over ~30 years as "no deadline" to avoid overflowing the clock.
  if (timeout.count() >= (int64_t{1} << 50)) return Clock::time_point::max();
  return Clock::now() + timeout;
}

// Runs `io` until `done`; false when the deadline passed or *stop became true first.
bool run_until(asio::io_context& io, const bool& done, Clock::time_point deadline,
               const std::atomic<bool>* stop) {
  while (!done) {
    const auto now = Clock::now();
    if (now >= deadline || (stop && stop->load())) return false;
    const auto left = deadline - now;
    io.restart();
    io.run_for(left < kSlice ? std::chrono::duration_cast<std::chrono::nanoseconds>(left)
                             : std::chrono::nanoseconds(kSlice));
  }
  return true;
}

// Cancels whatever is pending on `io` and lets the handlers run (with operation_aborted)
// so no handler outlives the stack frame it captured.
void drain(asio::io_context& io) {
  io.restart();
  io.run();
}
void abandon(asio::io_context& io, asio::ip::tcp::resolver& resolver) {
  resolver.cancel();
  drain(io);
}
template <typename Cancellable>
void abandon(asio::io_context& io, Cancellable& object) {
  asio::error_code ignored;
  object.cancel(ignored);
  drain(io);
}

std::string endpoint_text(const asio::ip::tcp::endpoint& ep) {
  return ep.address().to_string() + ":" + std::to_string(ep.port());
}

}  // namespace

FrameConnection::FrameConnection(std::unique_ptr<Impl> impl, std::string peer, std::string remote_address)
    : impl_(std::move(impl)), peer_(std::move(peer)), remote_address_(std::move(remote_address)) {}

FrameConnection::~FrameConnection() { close(); }

std::unique_ptr<FrameConnection> FrameConnection::connect(const std::string& host, uint16_t port,
                                                          std::chrono::milliseconds timeout,
                                                          const std::string& peer) {
  auto impl = std::make_unique<Impl>();
  const auto deadline = deadline_after(timeout);
  const std::string where = peer + " (" + host + ":" + std::to_string(port) + ")";

  asio::ip::tcp::resolver resolver(impl->io);
  asio::error_code ec;
  asio::ip::tcp::resolver::results_type endpoints;
  bool done = false;
  resolver.async_resolve(host, std::to_string(port),
                         [&](const asio::error_code& e, asio::ip::tcp::resolver::results_type r) {
                           ec = e;
                           endpoints = std::move(r);
                           done = true;
                         });
  if (!run_until(impl->io, done, deadline, nullptr)) {
    abandon(impl->io, resolver);
    fail_unavailable("timed out resolving " + where);
  }
  if (ec) fail_unavailable("cannot resolve " + where + ": " + ec.message());

  done = false;
  asio::async_connect(impl->socket, endpoints,
                      [&](const asio::error_code& e, const asio::ip::tcp::endpoint&) {
                        ec = e;
                        done = true;
                      });
  if (!run_until(impl->io, done, deadline, nullptr)) {
    abandon(impl->io, impl->socket);
    fail_unavailable("timed out after " + std::to_string(timeout.count()) +
                     " ms connecting to " + where);
  }
  if (ec) fail_unavailable("cannot connect to " + where + ": " + ec.message());
  // Frames are whole messages; Nagle would delay the small ones (hello, health).
  impl->socket.set_option(asio::ip::tcp::no_delay(true), ec);
  asio::error_code ep_ec;
  const auto remote = impl->socket.remote_endpoint(ep_ec);
  return std::make_unique<FrameConnection>(std::move(impl), peer, ep_ec ? std::string() : remote.address().to_string());
}

uint64_t FrameConnection::send(const Frame& frame, std::chrono::milliseconds timeout) {
  if (aborted()) fail_unavailable("connection to " + peer_ + " was aborted");
  if (!is_open()) fail_unavailable("connection to " + peer_ + " is closed");
  // The last frame after an interrupt: run the interrupt's handler now, while nothing is
  // pending, so it cannot cancel this write.
  if (interrupted()) {
    impl_->io.restart();
    impl_->io.poll();
  }
  asio::error_code ec;
  bool done = false;
  asio::async_write(impl_->socket, asio::buffer(frame), [&](const asio::error_code& e, size_t) {
    ec = e;
    done = true;
  });
  const auto deadline = deadline_after(timeout);
  impl_->busy = true;
  bool completed = false;
  if (impl_->read_while_sending && !impl_->read_error && impl_->inbox.size() < kMaxReadAheadFrames) {
    completed = send_while_reading(done, deadline);
  } else {
    completed = run_until(impl_->io, done, deadline, nullptr);
  }
  impl_->busy = false;
  if (!completed) {
    abandon(impl_->io, impl_->socket);
    close();
    fail_unavailable("timed out after " + std::to_string(timeout.count()) + " ms sending " +
                     std::to_string(frame.size()) + " bytes to " + peer_);
  }
  if (ec) {
    close();
    if (aborted()) fail_unavailable("connection to " + peer_ + " was aborted");
    fail_unavailable("cannot send to " + peer_ + ": " + ec.message());
  }
  return frame.size();
}

FrameBody FrameConnection::receive(std::chrono::milliseconds timeout,
                                   const std::atomic<bool>* stop) {
  if (aborted()) fail_unavailable("connection to " + peer_ + " was aborted");
  // Frames read during a send came before anything that happened after them.
  if (impl_ && !impl_->inbox.empty()) {
    FrameBody body = std::move(impl_->inbox.front());
    impl_->inbox.pop_front();
    return body;
  }
  if (impl_ && impl_->read_error) std::rethrow_exception(std::exchange(impl_->read_error, nullptr));
  if (!is_open()) fail_unavailable("connection to " + peer_ + " is closed");
  const auto interrupted_text = [&] { return "reading from " + peer_ + " interrupted"; };
  if (interrupted()) fail_unavailable(interrupted_text());
  const auto deadline = deadline_after(timeout);
  asio::error_code ec;
  size_t got = 0;
  bool done = false;
  auto on_read = [&](const asio::error_code& e, size_t n) {
    ec = e;
    got = n;
    done = true;
  };
  // interrupt() cancels a pending read (its handler runs on this thread, inside the
  // run_for below): the read then ends with operation_aborted, and the connection stays
  // open so the owner can still say why.
  auto fail_if_interrupted = [&] {
    if (ec == asio::error::operation_aborted && interrupted()) fail_unavailable(interrupted_text());
  };
  auto wait = [&](const char* what) {
    impl_->busy = true;
    const bool completed = run_until(impl_->io, done, deadline, stop);
    impl_->busy = false;
    if (!completed) {
      abandon(impl_->io, impl_->socket);
      close();
      if (stop && stop->load()) fail_unavailable("stopped while reading from " + peer_);
      fail_unavailable("timed out after " + std::to_string(timeout.count()) +
                       " ms waiting for " + what + " from " + peer_);
    }
  };

  uint8_t prefix[4];
  asio::async_read(impl_->socket, asio::buffer(prefix), on_read);
  wait("a frame");
  if (ec) {
    fail_if_interrupted();
    close();
    if (aborted()) fail_unavailable("connection to " + peer_ + " was aborted");
    if (ec == asio::error::eof && got == 0) fail_unavailable(peer_ + " closed the connection");
    if (ec == asio::error::eof) fail_protocol("truncated frame length prefix from " + peer_);
    fail_unavailable("cannot read from " + peer_ + ": " + ec.message());
  }
  // Checked before the body is allocated; on failure the connection is left open so the
  // caller can answer with an `error` frame before closing.
  const uint64_t length = frame_length(prefix, max_frame_bytes_, peer_);
  FrameBody body;
  body.bytes = length;
  body.words.resize(length / 8);
  done = false;
  asio::async_read(impl_->socket, asio::buffer(body.words.data(), length), on_read);
  wait("the rest of a frame");
  if (ec) {
    fail_if_interrupted();
    close();
    if (aborted()) fail_unavailable("connection to " + peer_ + " was aborted");
    if (ec == asio::error::eof) {
      fail_protocol("truncated frame from " + peer_ + ": got " + std::to_string(got) + " of " +
                    std::to_string(length) + " bytes");
    }
    fail_unavailable("cannot read from " + peer_ + ": " + ec.message());
  }
  return body;
}

void FrameConnection::close() {
  if (!impl_) return;
  std::lock_guard<std::mutex> lock(impl_->close_mutex);
  asio::error_code ignored;
  if (impl_->socket.is_open()) {
    impl_->socket.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
    impl_->socket.close(ignored);
  }
}

void FrameConnection::set_read_while_sending(bool on) { impl_->read_while_sending = on; }

bool FrameConnection::send_while_reading(const bool& written, std::chrono::steady_clock::time_point deadline) {
  // One frame at a time: wait until the socket is readable, read a whole frame, repeat
  // while the write is still going; a frame begun is finished before returning (the peer
  // sends whole frames), one not begun is not (its wait is cancelled). A read error is
  // kept for the next receive(): the write itself may well succeed.
  Impl& impl = *impl_;
  enum class Reading { kIdle, kWaiting, kFrame } reading = Reading::kIdle;
  uint8_t prefix[4];
  FrameBody body;
  const auto fail_read = [&](std::exception_ptr e) {
    impl.read_error = std::move(e);
    reading = Reading::kIdle;
  };
  const auto read_error = [&](const asio::error_code& e, const char* what) {
    if (e == asio::error::eof) {
      return std::make_exception_ptr(Error(ErrorCategory::kUnavailable, peer_ + " closed the connection"));
    }
    return std::make_exception_ptr(
        Error(ErrorCategory::kUnavailable, "cannot read " + std::string(what) + " from " + peer_ + ": " + e.message()));
  };
  std::function<void()> wait_next = [&] {
    if (written || impl.read_error || impl.inbox.size() >= kMaxReadAheadFrames) {
      reading = Reading::kIdle;
      return;
    }
    reading = Reading::kWaiting;
    impl.socket.async_wait(asio::ip::tcp::socket::wait_read, [&](const asio::error_code& e) {
      if (e) return fail_read(e == asio::error::operation_aborted ? nullptr : read_error(e, "a frame"));
      reading = Reading::kFrame;
      asio::async_read(impl.socket, asio::buffer(prefix), [&](const asio::error_code& e1, size_t) {
        if (e1) return fail_read(read_error(e1, "a frame length"));
        try {
          body.bytes = frame_length(prefix, max_frame_bytes_, peer_);
        } catch (const Error&) {
          return fail_read(std::current_exception());  // the stream is unusable from here
        }
        body.words.assign(body.bytes / 8, 0);
        asio::async_read(impl.socket, asio::buffer(body.words.data(), body.bytes), [&](const asio::error_code& e2, size_t) {
          if (e2) return fail_read(read_error(e2, "the rest of a frame"));
          impl.inbox.push_back(std::move(body));
          body = FrameBody{};
          wait_next();
        });
      });
    });
  };
  wait_next();
  bool cancelled = false;
  while (!written || reading != Reading::kIdle) {
    if (written && reading == Reading::kWaiting && !cancelled) {
      asio::error_code ignored;
      impl.socket.cancel(ignored);  // only the wait is pending: nothing of a frame is lost
      cancelled = true;
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      abandon(impl.io, impl.socket);  // the handlers hold this frame's locals: run them now
      return false;
    }
    const auto left = deadline - now;
    impl.io.restart();
    // One handler at a time, so the loop sees the write finish: run_for would go on
    // waiting for the read (the peer's reply, a whole round trip away) before returning.
    impl.io.run_one_for(left < kSlice ? std::chrono::duration_cast<std::chrono::nanoseconds>(left)
                                      : std::chrono::nanoseconds(kSlice));
  }
  return true;
}

bool FrameConnection::is_open() const { return impl_ && impl_->socket.is_open(); }

void FrameConnection::abort() {
  if (!impl_) return;
  std::lock_guard<std::mutex> lock(impl_->close_mutex);
  impl_->aborted = true;
  // shutdown(2) on the raw descriptor, not through Asio (whose socket object belongs to
  // the owner thread): the kernel wakes the owner's pending read or write, which then
  // fails, and poll() reports the socket readable.
  if (impl_->socket.is_open()) ::shutdown(impl_->socket.native_handle(), SHUT_RDWR);
}

bool FrameConnection::aborted() const { return impl_ && impl_->aborted.load(); }

std::vector<size_t> wait_readable(const std::vector<FrameConnection*>& connections,
                                  std::chrono::milliseconds timeout) {
  std::vector<pollfd> fds;
  std::vector<size_t> ready;
  for (size_t i = 0; i < connections.size(); ++i) {
    FrameConnection& c = *connections[i];
    if (!c.is_open() || c.aborted() || (c.impl_ && (!c.impl_->inbox.empty() || c.impl_->read_error))) {
      ready.push_back(i);  // a receive fails at once: nothing to wait for
      continue;
    }
    fds.push_back({c.impl_->socket.native_handle(), POLLIN, 0});
  }
  if (!ready.empty() || fds.empty()) return ready;
  const auto until = Clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    // Rounded up, so a wait never returns empty before its time.
    const int wait_ms = static_cast<int>(std::clamp<int64_t>(left.count() + 1, 0, 1 << 30));
    const int n = ::poll(fds.data(), fds.size(), left.count() <= 0 ? 0 : wait_ms);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_unavailable(std::string("poll failed: ") + std::strerror(errno));
    break;
  }
  for (size_t i = 0; i < fds.size(); ++i) {
    if (fds[i].revents != 0) ready.push_back(i);  // every connection was polled: same index
  }
  return ready;
}

void FrameConnection::interrupt() {
  if (!impl_) return;
  impl_->interrupted = true;  // a receive that starts later fails at once
  // Posting is thread-safe; the handler runs on the owner's thread, inside its next
  // run_for (at once when a read or write is pending), and cancels only a pending
  // operation; send() runs it first when it starts, so a last `error` frame goes out.
  Impl* impl = impl_.get();
  asio::post(impl->io, [impl] {
    asio::error_code ignored;
    if (impl->busy) impl->socket.cancel(ignored);
  });
}

bool FrameConnection::interrupted() const { return impl_ && impl_->interrupted.load(); }

FrameListener::FrameListener(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

FrameListener::~FrameListener() {
  asio::error_code ignored;
  impl_->acceptor.close(ignored);
}

std::unique_ptr<FrameListener> FrameListener::listen(const std::string& host, uint16_t port) {
  auto impl = std::make_unique<Impl>();
  const std::string where = host + ":" + std::to_string(port);
  asio::error_code ec;
  asio::ip::tcp::resolver resolver(impl->io);
  auto endpoints = resolver.resolve(host, std::to_string(port),
                                    asio::ip::tcp::resolver::passive, ec);
  if (ec || endpoints.empty()) {
    fail_unavailable("cannot resolve listen address " + where + ": " + ec.message());
  }
  const asio::ip::tcp::endpoint endpoint = *endpoints.begin();
  auto& acceptor = impl->acceptor;
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(asio::ip::tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) fail_unavailable("cannot listen on " + where + ": " + ec.message());
  return std::unique_ptr<FrameListener>(new FrameListener(std::move(impl)));
}

uint16_t FrameListener::port() const { return impl_->acceptor.local_endpoint().port(); }

std::unique_ptr<FrameConnection> FrameListener::accept(std::chrono::milliseconds timeout) {
  auto conn = std::make_unique<FrameConnection::Impl>();
  asio::error_code ec;
  bool done = false;
  impl_->acceptor.async_accept(conn->socket, [&](const asio::error_code& e) {
    ec = e;
    done = true;
  });
  if (!run_until(impl_->io, done, deadline_after(timeout), nullptr)) {
    abandon(impl_->io, impl_->acceptor);
    if (!done || ec) return nullptr;  // the accept raced the cancel and lost
  }
  if (ec) {
    // A client that reset before we accepted it is its problem, not the listener's.
    if (ec == asio::error::connection_aborted) return nullptr;
    fail_unavailable("accept failed on port " + std::to_string(port()) + ": " + ec.message());
  }
  conn->socket.set_option(asio::ip::tcp::no_delay(true), ec);
  asio::error_code ep_ec;
  const auto remote = conn->socket.remote_endpoint(ep_ec);
  std::string peer = ep_ec ? std::string("client") : "client " + endpoint_text(remote);
  return std::make_unique<FrameConnection>(std::move(conn), std::move(peer),
                                           ep_ec ? std::string() : remote.address().to_string());
}

}  // namespace charm
