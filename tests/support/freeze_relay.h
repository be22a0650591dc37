// Test support: a TCP relay on an ephemeral loopback port in front of a worker, that can
// be frozen. Frozen, it stops reading and accepting on every connection, as a stopped
// process (SIGSTOP) or a cut link does: the peers' connects still complete (the kernel's
// listen backlog), their bytes pile up in socket buffers, and nothing is answered, reset
// or closed. Thawed, it forwards what piled up and goes on; a side that closed meanwhile
// is closed on the other side then.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace charm::test {

/// Forwards 127.0.0.1:port() to 127.0.0.1:target. One thread; stopped by the destructor.
/// Thread-safety: freeze()/thaw() from any thread.
class FreezeRelay {
 public:
  explicit FreezeRelay(uint16_t target, bool frozen = false) : target_(target), frozen_(frozen) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (listener_ < 0) throw std::runtime_error("relay: socket failed");
    const int one = 1;
    ::setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr = loopback(0);
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listener_, 64) != 0) {
      ::close(listener_);
      throw std::runtime_error("relay: cannot listen");
    }
    socklen_t len = sizeof addr;
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { loop(); });
  }
  ~FreezeRelay() {
    stop_ = true;
    thread_.join();
    for (const Pair& p : pairs_) {
      ::close(p.client);
      ::close(p.server);
    }
    ::close(listener_);
  }
  FreezeRelay(const FreezeRelay&) = delete;
  FreezeRelay& operator=(const FreezeRelay&) = delete;

  uint16_t port() const { return port_; }
  void freeze() { frozen_ = true; }
  void thaw() { frozen_ = false; }
  /// Connections accepted so far (a frozen relay accepts none).
  size_t accepted() const { return accepted_.load(); }

 private:
  struct Pair {
    int client = -1;
    int server = -1;
  };

  static sockaddr_in loopback(uint16_t port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return addr;
  }

  void loop() {
    std::vector<char> buffer(1 << 16);
    while (!stop_) {
      if (frozen_) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        continue;
      }
      std::vector<pollfd> fds = {{listener_, POLLIN, 0}};
      for (const Pair& p : pairs_) {
        fds.push_back({p.client, POLLIN, 0});
        fds.push_back({p.server, POLLIN, 0});
      }
      if (::poll(fds.data(), fds.size(), 5) <= 0 || frozen_) continue;
      const size_t polled = pairs_.size();
      if (fds[0].revents & POLLIN) accept_one();
      std::vector<Pair> kept;
      for (size_t i = 0; i < polled; ++i) {
        Pair& p = pairs_[i];
        bool open = true;
        if (fds[1 + 2 * i].revents) open = forward(p.client, p.server, buffer);
        if (open && fds[2 + 2 * i].revents) open = forward(p.server, p.client, buffer);
        if (open) {
          kept.push_back(p);
        } else {
          ::close(p.client);
          ::close(p.server);
        }
      }
      // A pair accepted in this pass was appended after the polled ones.
      for (size_t i = polled; i < pairs_.size(); ++i) kept.push_back(pairs_[i]);
      pairs_ = std::move(kept);
    }
  }

  void accept_one() {
    const int client = ::accept(listener_, nullptr, nullptr);
    if (client < 0) return;
    const int server = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr = loopback(target_);
    if (server < 0 || ::connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(client);
      if (server >= 0) ::close(server);
      return;
    }
    const int one = 1;
    ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    ::setsockopt(server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    pairs_.push_back({client, server});
    ++accepted_;
  }

  // One read from `from`, written whole to `to`; false when either side is done.
  static bool forward(int from, int to, std::vector<char>& buffer) {
    const ssize_t n = ::recv(from, buffer.data(), buffer.size(), 0);
    if (n <= 0) return false;
    for (ssize_t done = 0; done < n;) {
      const ssize_t w = ::send(to, buffer.data() + done, static_cast<size_t>(n - done), MSG_NOSIGNAL);
      if (w <= 0) return false;
      done += w;
    }
    return true;
  }

  uint16_t target_;
  uint16_t port_ = 0;
  int listener_ = -1;
  std::atomic<bool> frozen_;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> accepted_{0};
  std::vector<Pair> pairs_;  // the relay thread's only
  std::thread thread_;
};

}  // namespace charm::test
