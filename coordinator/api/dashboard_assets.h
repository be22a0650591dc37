// The dashboard's static files (coordinator/api/dashboard/: HTML, JS, CSS, hand-written),
// compiled into the binary by cmake/embed_files.cmake. Served by the HTTP API at / and
// /dashboard/<name> (docs/api.md).
#pragma once

#include <span>
#include <string_view>

namespace charm {

/// One embedded file: its name in coordinator/api/dashboard/ and its bytes.
struct EmbeddedFile {
  std::string_view name;
  std::string_view bytes;
};

/// Every file of coordinator/api/dashboard/, in name order (defined in the generated
/// dashboard_assets.cpp of the build folder). The views live as long as the program.
std::span<const EmbeddedFile> dashboard_files();

/// The file named `name` ("index.html"), or null.
inline const EmbeddedFile* find_dashboard_file(std::string_view name) {
  for (const EmbeddedFile& f : dashboard_files())
    if (f.name == name) return &f;
  return nullptr;
}

/// The Content-Type for a file name by its extension (html, js, css, svg, png; else
/// application/octet-stream).
inline const char* dashboard_content_type(std::string_view name) {
  auto ends = [&](std::string_view ext) { return name.size() >= ext.size() && name.substr(name.size() - ext.size()) == ext; };
  if (ends(".html")) return "text/html; charset=utf-8";
  if (ends(".js")) return "text/javascript; charset=utf-8";
  if (ends(".css")) return "text/css; charset=utf-8";
  if (ends(".svg")) return "image/svg+xml";
  if (ends(".png")) return "image/png";
  return "application/octet-stream";
}

}  // namespace charm
