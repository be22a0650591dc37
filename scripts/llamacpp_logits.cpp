// The last position's logits of a prompt, as llama.cpp computes them, for
// scripts/llamacpp_logits.py (which compiles this against a llama.cpp build; not part of
// charm's build). CPU only, f32 KV cache, no flash attention, one thread: the closest
// llama.cpp comes to charm's exact arithmetic, so the difference charm reports is the
// models', not a cache precision's.
//   llamacpp_logits MODEL.gguf IDS OUT.f32
// IDS: comma-separated token ids. OUT: raw little-endian f32 [n_vocab]. Exit 1 with a
// message on stderr when llama.cpp cannot load or run the file.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "llama.h"

namespace {

std::vector<llama_token> parse_ids(const char* text) {
  std::vector<llama_token> ids;
  std::string s(text);
  size_t at = 0;
  while (at < s.size()) {
    const size_t comma = s.find(',', at);
    ids.push_back(static_cast<llama_token>(std::stol(s.substr(at, comma - at))));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return ids;
}

void quiet(ggml_log_level level, const char* text, void*) {
  if (level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s MODEL.gguf IDS OUT.f32\n", argv[0]);
    return 2;
  }
  llama_log_set(quiet, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) {
    std::fprintf(stderr, "llama.cpp cannot load %s\n", argv[1]);
    return 1;
  }
  std::vector<llama_token> ids = parse_ids(argv[2]);
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(ids.size() + 16);
  cp.n_batch = cp.n_ubatch = static_cast<uint32_t>(ids.size());
  cp.n_threads = cp.n_threads_batch = 1;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.type_k = cp.type_v = GGML_TYPE_F32;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) {
    std::fprintf(stderr, "llama.cpp cannot make a context for %s\n", argv[1]);
    return 1;
  }
  if (llama_decode(ctx, llama_batch_get_one(ids.data(), static_cast<int32_t>(ids.size()))) != 0) {
    std::fprintf(stderr, "llama_decode failed on %s\n", argv[1]);
    return 1;
  }
  const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  const float* logits = llama_get_logits_ith(ctx, -1);
  FILE* out = std::fopen(argv[3], "wb");
  if (!out || std::fwrite(logits, sizeof(float), static_cast<size_t>(n_vocab), out) != static_cast<size_t>(n_vocab)) {
    std::fprintf(stderr, "cannot write %s\n", argv[3]);
    return 1;
  }
  std::fclose(out);
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
