// Tests of common/listen_check.h: which addresses are loopback, and the rule that a
// socket other machines can reach needs authentication or an explicit insecure key.
// Only numeric addresses and "localhost" (RFC 6761: always loopback) are resolved, so no
// test depends on the network or the host name.
#include <doctest/doctest.h>

#include "common/error.h"
#include "common/listen_check.h"
#include "tests/support/expect_error.h"

using namespace charm;

TEST_CASE("loopback: 127.0.0.0/8, ::1 and its v4-mapped form, localhost; everything else is reachable") {
  for (const char* host : {"127.0.0.1", "127.1.2.3", "127.255.255.254", "::1", "::ffff:127.0.0.1", "localhost"}) {
    CAPTURE(host);
    CHECK(is_loopback_host(host));
  }
  for (const char* host : {"", "0.0.0.0", "::", "192.168.1.10", "10.0.0.1", "128.0.0.1", "126.255.255.255",
                           "::ffff:10.0.0.1", "fe80::1", "2001:db8::1"}) {
    CAPTURE(host);
    CHECK_FALSE(is_loopback_host(host));
  }
  test::expect_error([] { is_loopback_host("300.1.1.1.invalid."); }, ErrorCategory::kUnavailable,
                     {"300.1.1.1.invalid.", "cannot resolve"});
}

TEST_CASE("a reachable socket without authentication is refused unless insecure; loopback or a secret pass") {
  ListenSpec spec;
  spec.what = "worker 'w0'";
  spec.port = 7701;
  spec.insecure_key = "cluster.insecure";
  spec.remedy = "Create one with `charm secret new cluster.secret`.";
  for (const char* host : {"0.0.0.0", "::", "192.168.1.10", ""}) {
    CAPTURE(host);
    spec.host = host;
    test::expect_error([&] { check_listen(spec); }, ErrorCategory::kInvalidInput,
                       {"worker 'w0'", std::string(host) + ":7701", "without authentication", "charm secret new",
                        "cluster.insecure: true"});
    spec.insecure = true;
    CHECK_NOTHROW(check_listen(spec));  // with a warning
    spec.insecure = false;
    spec.authenticated = true;
    CHECK_NOTHROW(check_listen(spec));
    spec.authenticated = false;
  }
  for (const char* host : {"127.0.0.1", "::1", "localhost"}) {
    CAPTURE(host);
    spec.host = host;
    CHECK_NOTHROW(check_listen(spec));
  }
}
