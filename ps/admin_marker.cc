#include "ps/admin_marker.h"

#include <charconv>
#include <sstream>

#include "ps/read_file_internal.h"

namespace tessera {
namespace {

Result<uint64_t> ParseNumber(std::string_view text, const std::string& what, uint64_t max) {
  uint64_t v = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end || v > max) {
    return Status::Corruption(what + " is '" + std::string(text) + "', not a number up to " +
                              std::to_string(max));
  }
  return v;
}

Result<std::vector<uint32_t>> ParseIds(const std::string& text, uint64_t servers,
                                       const std::string& where) {
  std::vector<uint32_t> ids;
  std::istringstream in(text);
  std::string id;
  while (in >> id) {
    TESSERA_ASSIGN_OR_RETURN(uint64_t v, ParseNumber(id, where + ": a server id", 65534));
    if (!ids.empty() && v <= ids.back()) {
      return Status::Corruption(where + ": server_ids must be ascending, got " + text);
    }
    ids.push_back(static_cast<uint32_t>(v));
  }
  if (ids.size() != servers) {
    return Status::Corruption(where + ": server_ids names " + std::to_string(ids.size()) +
                              " servers, `servers` says " + std::to_string(servers));
  }
  return ids;
}

}  // namespace

Result<uint64_t> AdminMarker::Number(const std::string& key, uint64_t max) const {
  auto it = fields.find(key);
  if (it == fields.end()) return Status::Corruption("the marker has no '" + key + "' line");
  return ParseNumber(it->second, "the marker's " + key, max);
}

Result<int64_t> AdminMarker::SignedNumber(const std::string& key) const {
  auto it = fields.find(key);
  if (it == fields.end()) return Status::Corruption("the marker has no '" + key + "' line");
  std::string_view text = it->second;
  const bool negative = !text.empty() && text[0] == '-';
  TESSERA_ASSIGN_OR_RETURN(uint64_t v, ParseNumber(text.substr(negative ? 1 : 0),
                                                   "the marker's " + key, INT64_MAX));
  return negative ? -static_cast<int64_t>(v) : static_cast<int64_t>(v);
}

Result<AdminMarker> ReadAdminMarker(const std::string& path, std::string_view what,
                                    const std::string& inside) {
  auto text = internal::ReadRegularFile(
      path, internal::ReadFileOptions{.inside = inside, .max_bytes = kMaxAdminMarkerBytes});
  if (text.status().code() == StatusCode::kNotFound) {
    return Status::NotFound("no marker '" + path + "'");
  }
  TESSERA_RETURN_IF_ERROR(text.status());
  std::istringstream in(*text);
  std::string line;
  if (!std::getline(in, line) || line != "tessera " + std::string(what)) {
    return Status::Corruption("'" + path + "' is not a " + std::string(what) + " marker");
  }
  AdminMarker m;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const size_t sp = line.find(' ');
    if (sp == std::string::npos || sp == 0) {
      return Status::Corruption("'" + path + "': line '" + line + "' is not 'key value'");
    }
    m.fields[line.substr(0, sp)] = line.substr(sp + 1);
  }
  auto servers = m.Number("servers", 65535);
  if (!servers.ok() || *servers == 0) {
    return Status::Corruption("'" + path + "' names no servers" +
                              (servers.ok() ? std::string() : ": " + servers.status().message()));
  }
  auto ids = m.fields.find("server_ids");
  if (ids != m.fields.end()) {
    TESSERA_ASSIGN_OR_RETURN(m.server_ids, ParseIds(ids->second, *servers, "'" + path + "'"));
  } else {
    for (uint32_t s = 0; s < *servers; ++s) m.server_ids.push_back(s);
  }
  return m;
}

std::string FormatServerIds(const std::vector<uint32_t>& ids) {
  std::string s;
  for (uint32_t id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
  return s;
}

}  // namespace tessera
