// ClientWatch finds an accepted connection by its peer address and sees the peer hang up.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include "coordinator/api/client_watch.h"

using charm::ClientWatch;

namespace {

/// A loopback listener, a client connected to it and the accepted server-side socket.
struct LoopbackPair {
  int listener = -1, client = -1, accepted = -1;
  int client_port = 0;

  LoopbackPair() {
    listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    REQUIRE(listen(listener, 1) == 0);
    socklen_t len = sizeof(addr);
    REQUIRE(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    client = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    accepted = accept(listener, nullptr, nullptr);
    REQUIRE(accepted >= 0);
    sockaddr_in local{};
    len = sizeof(local);
    REQUIRE(getsockname(client, reinterpret_cast<sockaddr*>(&local), &len) == 0);
    client_port = ntohs(local.sin_port);
  }
  ~LoopbackPair() {
    for (int fd : {listener, client, accepted}) {
      if (fd >= 0) close(fd);
    }
  }
};

}  // namespace

TEST_CASE("a connected client is found and is not gone; pipelined bytes do not count") {
  LoopbackPair pair;
  const ClientWatch watch("127.0.0.1", pair.client_port);
  REQUIRE(watch.found());
  CHECK_FALSE(watch.gone());
  REQUIRE(write(pair.client, "GET / HTTP/1.1\r\n\r\n", 18) == 18);
  CHECK_FALSE(watch.gone());
}

TEST_CASE("a client that closes its side is gone") {
  LoopbackPair pair;
  const ClientWatch watch("127.0.0.1", pair.client_port);
  REQUIRE(watch.found());
  close(pair.client);
  pair.client = -1;
  bool gone = false;
  for (int i = 0; i < 1000 && !gone; ++i) {  // the FIN is delivered asynchronously
    gone = watch.gone();
    if (!gone) usleep(1000);
  }
  CHECK(gone);
}

TEST_CASE("no socket with that peer: not found, never gone") {
  LoopbackPair pair;
  const ClientWatch watch("127.0.0.1", pair.client_port == 1 ? 2 : 1);
  CHECK_FALSE(watch.found());
  CHECK_FALSE(watch.gone());
  const ClientWatch other_ip("10.0.0.1", pair.client_port);
  CHECK_FALSE(other_ip.found());
}
