// common/reused_buffer.h: storage is kept for smaller and equal requests, grows for larger
// ones, and is given back after an oversized one.
#include <doctest/doctest.h>

#include <cstddef>

#include "common/reused_buffer.h"

using namespace charm;

TEST_CASE("ReusedBuffer keeps its storage for requests it holds and reallocates for larger ones") {
  ReusedBuffer<float> b;
  CHECK(b.capacity() == 0);
  float* const first = b.get(100);
  REQUIRE(first != nullptr);
  CHECK(b.capacity() == 100);
  first[99] = 3.5f;
  CHECK(b.get(40) == first);  // smaller: the same storage, contents left as they were
  CHECK(b.get(100) == first);
  CHECK(first[99] == 3.5f);
  CHECK(b.capacity() == 100);
  b.get(101);
  CHECK(b.capacity() == 101);
}

TEST_CASE("ReusedBuffer gives back storage above kKeptBytes at the next request below it") {
  struct Mib {  // one MiB per element, so the oversized request is a few hundred elements
    std::byte b[size_t{1} << 20];
  };
  ReusedBuffer<Mib> b;
  const size_t over = ReusedBuffer<Mib>::kKeptBytes / sizeof(Mib) + 1;
  b.get(over);  // reserved, never touched: address space only
  CHECK(b.capacity() == over);
  b.get(over);  // the same size again: kept
  CHECK(b.capacity() == over);
  b.get(2);
  CHECK(b.capacity() == 2);
}
