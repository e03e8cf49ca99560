#include "ps/routing.h"

#include <charconv>
#include <fstream>
#include <sstream>

namespace tessera {

SlotMap SlotMap::Uniform(uint32_t num_servers) {
  SlotMap m;
  m.num_servers_ = num_servers;
  m.owners_.resize(kNumSlots);
  for (uint32_t s = 0; s < kNumSlots; ++s) {
    m.owners_[s] = static_cast<uint16_t>(uint64_t{s} * num_servers / kNumSlots);
  }
  return m;
}

Result<SlotMap> SlotMap::FromOwners(std::vector<uint16_t> owners, uint32_t num_servers) {
  if (owners.size() != kNumSlots) {
    return Status::InvalidArgument("slot map has " + std::to_string(owners.size()) +
                                   " slots, expected " + std::to_string(kNumSlots));
  }
  if (num_servers == 0) return Status::InvalidArgument("slot map with zero servers");
  for (uint16_t o : owners) {
    if (o >= num_servers) {
      return Status::InvalidArgument("slot map names server " + std::to_string(o) + " of " +
                                     std::to_string(num_servers));
    }
  }
  SlotMap m;
  m.owners_ = std::move(owners);
  m.num_servers_ = num_servers;
  return m;
}

DenseRange DenseRangeOfServer(uint64_t table_id, uint64_t length, uint32_t server,
                              uint32_t num_servers) {
  const uint64_t chunks = (length + kDenseChunkFloats - 1) / kDenseChunkFloats;
  const uint32_t block =
      static_cast<uint32_t>((server + num_servers - table_id % num_servers) % num_servers);
  const uint64_t first = chunks * block / num_servers;
  const uint64_t last = chunks * (block + 1) / num_servers;
  DenseRange r;
  r.begin = std::min(length, first * kDenseChunkFloats);
  r.end = std::min(length, last * kDenseChunkFloats);
  return r;
}

Result<uint64_t> ParseStoredNumber(std::string_view text, std::string_view what, uint64_t max) {
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || p != text.data() + text.size() || v > max) {
    return Status::Corruption(std::string(what) + " is not a valid number: '" +
                              std::string(text.substr(0, 32)) + "'");
  }
  return v;
}

Status ValidateEndpoint(std::string_view endpoint, bool allow_any_port) {
  const std::string quoted = "endpoint '" + std::string(endpoint) + "'";
  constexpr std::string_view kTcp = "tcp://";
  if (endpoint.substr(0, kTcp.size()) != kTcp) {
    return Status::InvalidArgument(quoted + " must be tcp://HOST:PORT");
  }
  const std::string_view rest = endpoint.substr(kTcp.size());
  const size_t colon = rest.rfind(':');
  if (colon == std::string_view::npos) {
    return Status::InvalidArgument(quoted + " has no port (tcp://HOST:PORT)");
  }
  const std::string_view host = rest.substr(0, colon);
  const std::string_view port = rest.substr(colon + 1);
  if (host.empty()) return Status::InvalidArgument(quoted + " has an empty host");
  if (host.find_first_of(" \t/") != std::string_view::npos) {
    return Status::InvalidArgument(quoted + ": host '" + std::string(host) + "' is not valid");
  }
  if (allow_any_port && port == "*") return Status::OK();
  uint32_t p = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || p < 1 ||
      p > 65535) {
    return Status::InvalidArgument(quoted + ": port '" + std::string(port) +
                                   "' is not a number in 1..65535");
  }
  return Status::OK();
}

Result<std::vector<std::string>> ParseClusterList(const std::string& spec) {
  std::vector<std::string> out;
  if (!spec.empty() && spec[0] == '@') {
    const std::string path = spec.substr(1);
    std::ifstream file(path, std::ios::in | std::ios::binary);
    if (!file) return Status::IOError("cannot read cluster file '" + path + "'");
    // Read with a cap (a pipe has no size to check first): /dev/zero ends here.
    std::string text(kMaxClusterFileBytes + 1, '\0');
    file.read(text.data(), static_cast<std::streamsize>(text.size()));
    if (file.bad()) return Status::IOError("cannot read cluster file '" + path + "'");
    text.resize(static_cast<size_t>(file.gcount()));
    if (text.size() > kMaxClusterFileBytes) {
      return Status::InvalidArgument("cluster file '" + path + "' holds more than " +
                                     std::to_string(kMaxClusterFileBytes) +
                                     " bytes (the bound on a cluster file)");
    }
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
      size_t a = line.find_first_not_of(" \t\r");
      if (a == std::string::npos || line[a] == '#') continue;
      size_t b = line.find_last_not_of(" \t\r");
      out.push_back(line.substr(a, b - a + 1));
    }
  } else {
    std::stringstream ss(spec);
    std::string item;
    while (std::getline(ss, item, ',')) {
      const size_t a = item.find_first_not_of(" \t");
      if (a == std::string::npos) continue;
      out.push_back(item.substr(a, item.find_last_not_of(" \t") - a + 1));
    }
  }
  if (out.empty()) return Status::InvalidArgument("cluster list is empty");
  for (const std::string& e : out) TESSERA_RETURN_IF_ERROR(ValidateEndpoint(e));
  if (out.size() > 65535) return Status::InvalidArgument("too many servers in cluster list");
  return out;
}

}  // namespace tessera
