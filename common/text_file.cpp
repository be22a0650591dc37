#include "common/text_file.h"

#include <fstream>
#include <sstream>
#include <system_error>

#include "common/error.h"

namespace charm {

std::string read_text_file(const std::filesystem::path& path, uint64_t max_bytes, const std::string& what) {
  auto require_within = [&](uint64_t bytes) {
    if (bytes > max_bytes) {
      fail_invalid(path.string() + ": " + std::to_string(bytes) + " bytes is over the limit of " +
                   std::to_string(max_bytes) + " bytes for " + what);
    }
  };
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) fail_io(path.string() + ": cannot open: not a readable file");
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) fail_io(path.string() + ": cannot read its size: " + ec.message());
  require_within(size);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_io(path.string() + ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) fail_io(path.string() + ": read failed");
  std::string out = std::move(text).str();
  require_within(out.size());  // a file that grew since the size check is held to the limit too
  return out;
}

}  // namespace charm
