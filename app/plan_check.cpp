#include "app/plan_check.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include <httplib.h>

#include "common/error.h"

namespace charm {
namespace {

std::string fixed(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

[[noreturn]] void bad_line(size_t line, const std::string& why) {
  fail_protocol("/metrics line " + std::to_string(line) + ": " + why);
}

bool name_char(char c, bool first) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':' ||
         (!first && std::isdigit(static_cast<unsigned char>(c)));
}

/// Parses `{a="x",b="y"}` at text[pos] (pos at '{'); leaves pos after '}'.
std::map<std::string, std::string> parse_labels(const std::string& text, size_t& pos, size_t line) {
  std::map<std::string, std::string> labels;
  ++pos;
  while (pos < text.size() && text[pos] != '}') {
    const size_t start = pos;
    while (pos < text.size() && name_char(text[pos], pos == start)) ++pos;
    if (pos == start) bad_line(line, "expected a label name");
    const std::string key = text.substr(start, pos - start);
    if (pos + 1 >= text.size() || text[pos] != '=' || text[pos + 1] != '"') bad_line(line, "expected =\" after label " + key);
    pos += 2;
    std::string value;
    while (pos < text.size() && text[pos] != '"') {
      if (text[pos] == '\\' && pos + 1 < text.size()) {
        const char e = text[++pos];
        value += e == 'n' ? '\n' : e;
      } else {
        value += text[pos];
      }
      ++pos;
    }
    if (pos >= text.size()) bad_line(line, "unterminated label value");
    ++pos;  // the closing quote
    labels[key] = value;
    if (pos < text.size() && text[pos] == ',') ++pos;
  }
  if (pos >= text.size()) bad_line(line, "unterminated label set");
  ++pos;
  return labels;
}

MetricSample parse_sample(const std::string& text, size_t line) {
  MetricSample s;
  size_t pos = 0;
  while (pos < text.size() && name_char(text[pos], pos == 0)) ++pos;
  if (pos == 0) bad_line(line, "expected a metric name");
  s.name = text.substr(0, pos);
  if (pos < text.size() && text[pos] == '{') s.labels = parse_labels(text, pos, line);
  if (pos >= text.size() || text[pos] != ' ') bad_line(line, "expected a space before the value");
  std::istringstream rest(text.substr(pos));
  std::string value;
  rest >> value;
  if (value == "+Inf" || value == "-Inf" || value == "NaN") {
    s.value = value == "NaN" ? NAN : (value[0] == '-' ? -INFINITY : INFINITY);
    return s;
  }
  char* end = nullptr;
  s.value = std::strtod(value.c_str(), &end);
  if (value.empty() || end != value.c_str() + value.size()) bad_line(line, "the value '" + value + "' is not a number");
  return s;
}

/// The value of an unlabelled sample named `name`, if present.
std::optional<double> unlabelled(const std::vector<MetricSample>& samples, const std::string& name) {
  for (const MetricSample& s : samples) {
    if (s.name == name && s.labels.empty()) return s.value;
  }
  return std::nullopt;
}

Comparison compare(std::string what, double predicted, std::optional<double> measured, std::string why_not) {
  Comparison c;
  c.what = std::move(what);
  c.predicted = predicted;
  c.measured = measured;
  if (!measured) c.why_not = std::move(why_not);
  return c;
}

std::optional<double> hit_rate(uint64_t hits, uint64_t misses) {
  if (hits + misses == 0) return std::nullopt;
  return static_cast<double>(hits) / static_cast<double>(hits + misses);
}

}  // namespace

std::optional<double> Comparison::relative_error() const {
  if (!measured || *measured == 0) return std::nullopt;
  return (predicted - *measured) / *measured;
}

std::vector<MetricSample> parse_prometheus(const std::string& text) {
  if (text.size() > kMaxMetricsBytes) {
    fail_protocol("/metrics: " + std::to_string(text.size()) + " bytes is over the limit of " +
                  std::to_string(kMaxMetricsBytes));
  }
  std::vector<MetricSample> out;
  std::istringstream in(text);
  std::string line;
  size_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    out.push_back(parse_sample(line, number));
  }
  return out;
}

MeasuredRun measured_run(const std::vector<MetricSample>& samples, const std::vector<WorkerStatus>& cluster) {
  MeasuredRun run;
  const auto count = unlabelled(samples, "charm_time_per_output_token_seconds_count");
  const auto sum = unlabelled(samples, "charm_time_per_output_token_seconds_sum");
  if (count && sum && *count > 0 && *sum > 0) {
    run.tokens_timed = static_cast<uint64_t>(*count);
    run.decode_tokens_per_s = *count / *sum;
  }
  for (const MetricSample& s : samples) {
    const auto worker = s.labels.find("worker");
    if (worker == s.labels.end() || !(s.value >= 0)) continue;
    if (s.name == "charm_expert_hits_total") run.hits[worker->second] += static_cast<uint64_t>(s.value);
    if (s.name == "charm_expert_misses_total") run.misses[worker->second] += static_cast<uint64_t>(s.value);
  }
  for (const WorkerStatus& w : cluster) {
    if (w.requests > 0) run.rtt_p50_ms[w.name] = w.rtt_p50_ms;
  }
  return run;
}

std::vector<Comparison> compare_plan(const PlanReport& plan, const MeasuredRun& run) {
  std::vector<Comparison> rows;
  rows.push_back(compare("decode tok/s", plan.prediction.tokens_per_s, run.decode_tokens_per_s,
                         "no request has generated two tokens yet"));
  uint64_t hits = 0, misses = 0;
  for (const auto& [w, h] : run.hits) hits += h;
  for (const auto& [w, m] : run.misses) misses += m;
  rows.push_back(compare("hit rate", plan.prediction.hit_rate, hit_rate(hits, misses), "no expert lookups counted yet"));
  for (size_t i = 0; i < plan.workers.size(); ++i) {
    const std::string& name = plan.workers[i].name;
    const WorkerPlan& p = plan.prediction.workers[i];
    const auto h = run.hits.find(name);
    const auto m = run.misses.find(name);
    rows.push_back(compare("hit rate " + name, p.hit_rate,
                           hit_rate(h == run.hits.end() ? 0 : h->second, m == run.misses.end() ? 0 : m->second),
                           "no lookups counted for it"));
    if (!plan.workers[i].link) continue;
    const auto rtt = run.rtt_p50_ms.find(name);
    rows.push_back(compare("layer RTT " + name + " (ms)", 1e3 * p.layer_round_trip_s,
                           rtt == run.rtt_p50_ms.end() ? std::nullopt : std::optional<double>(rtt->second),
                           "no layer requests in /cluster/status"));
  }
  return rows;
}

std::string format_check(const std::vector<Comparison>& rows) {
  std::vector<std::vector<std::string>> table = {{"WHAT", "PREDICTED", "MEASURED", "ERROR"}};
  for (const Comparison& c : rows) {
    const auto e = c.relative_error();
    table.push_back({c.what, fixed(c.predicted, 4), c.measured ? fixed(*c.measured, 4) : "-",
                     e ? (*e >= 0 ? "+" : "") + fixed(100 * *e, 1) + "%" : "-"});
  }
  std::vector<size_t> width(4, 0);
  for (const auto& row : table) {
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out;
  for (const auto& row : table) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) line += row[i] + std::string(width[i] - row[i].size() + 2, ' ');
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  for (const Comparison& c : rows) {
    if (!c.measured) out += c.what + ": not measured (" + c.why_not + ")\n";
  }
  return out;
}

nlohmann::json check_json(const std::vector<Comparison>& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const Comparison& c : rows) {
    const auto e = c.relative_error();
    out.push_back({{"what", c.what},
                   {"predicted", c.predicted},
                   {"measured", c.measured ? nlohmann::json(*c.measured) : nlohmann::json(nullptr)},
                   {"relative_error", e ? nlohmann::json(*e) : nlohmann::json(nullptr)},
                   {"why_not", c.why_not}});
  }
  return out;
}

void require_served_model(const std::string& models_body, const std::string& model_name, const std::string& where) {
  const nlohmann::json doc = nlohmann::json::parse(models_body, nullptr, false);
  if (!doc.is_object() || !doc.contains("data") || !doc["data"].is_array()) {
    fail_protocol(where + "/v1/models: not an OpenAI model list");
  }
  std::vector<std::string> served;
  for (const nlohmann::json& m : doc["data"]) {
    if (!m.is_object() || !m.contains("id") || !m["id"].is_string()) fail_protocol(where + "/v1/models: a model without an id");
    served.push_back(m["id"].get<std::string>());
  }
  if (std::find(served.begin(), served.end(), model_name) != served.end()) return;
  std::string list;
  for (const std::string& id : served) list += (list.empty() ? "'" : ", '") + id + "'";
  fail_invalid("the coordinator at " + where + " serves " + (list.empty() ? "no model" : list) +
               ", not this config's model '" + model_name + "': --check compares a plan only with its own model's run");
}

std::string fetch_coordinator(const Topology& topology, const std::string& path, int timeout_ms, uint64_t cap) {
  httplib::Client client(topology.api_host, topology.api_port);
  const auto seconds = timeout_ms / 1000;
  const auto micros = (timeout_ms % 1000) * 1000;
  client.set_connection_timeout(seconds, micros);
  client.set_read_timeout(seconds, micros);
  client.set_write_timeout(seconds, micros);
  if (!topology.api_key.empty()) client.set_bearer_token_auth(topology.api_key.c_str());
  const std::string where = "GET http://" + topology.api_host + ":" + std::to_string(topology.api_port) + path;
  std::string body;
  bool too_big = false;
  auto res = client.Get(path, [&](const char* data, size_t size) {
    too_big = body.size() + size > cap;
    if (!too_big) body.append(data, size);
    return !too_big;
  });
  if (too_big) fail_protocol(where + ": the body exceeds the cap of " + std::to_string(cap) + " bytes");
  if (!res) fail_unavailable(where + ": no answer (" + httplib::to_string(res.error()) + "); is charm serve running?");
  if (res->status != 200) fail_unavailable(where + " answered HTTP " + std::to_string(res->status));
  return body;
}

}  // namespace charm
