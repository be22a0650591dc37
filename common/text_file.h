// Whole-file reads with a size limit, for the small text files charm reads (topologies,
// JSON files, chat templates): a wrong path that names a 100 GB weight file must fail at
// once, not after reading it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace charm {

/// The bytes of `path`, refusing a file over `max_bytes` before reading it. Throws
/// Error(kIo) "<path>: cannot open ..." when it is absent, not a regular file or cannot be
/// opened, or a read fails; Error(kInvalidInput) "<path>: N bytes is over the limit of M
/// bytes for <what>" when too large (`what` names the kind of file, "a topology file").
std::string read_text_file(const std::filesystem::path& path, uint64_t max_bytes, const std::string& what);

}  // namespace charm
