#include <charconv>

#include "absl/strings/escaping.h"
#include "ps/coord/etcd_json_internal.h"

namespace tessera::internal {

using nlohmann::json;

namespace {

// Text of etcd's that goes into an error message: bounded, so a large body cannot flood a log.
std::string Excerpt(std::string_view text) {
  constexpr size_t kMax = 200;
  if (text.size() <= kMax) return std::string(text);
  return std::string(text.substr(0, kMax)) + "...";
}

}  // namespace

std::string Base64(std::string_view bytes) {
  return absl::Base64Escape(absl::string_view(bytes.data(), bytes.size()));
}

Result<std::string> Base64Field(const json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end()) return std::string();
  if (!it->is_string()) return Status::Corruption(std::string(name) + " is not a string");
  std::string out;
  if (!absl::Base64Unescape(it->get_ref<const std::string&>(), &out)) {
    return Status::Corruption(std::string(name) + " is not base64");
  }
  return out;
}

Result<int64_t> Int64Field(const json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end()) return int64_t{0};
  if (it->is_number_integer()) return it->get<int64_t>();
  if (!it->is_string()) return Status::Corruption(std::string(name) + " is not an int64");
  const std::string& s = it->get_ref<const std::string&>();
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) {
    return Status::Corruption(std::string(name) + " is not an int64: \"" + Excerpt(s) + "\"");
  }
  return v;
}

bool BoolField(const json& obj, const char* name) {
  auto it = obj.find(name);
  return it != obj.end() && it->is_boolean() && it->get<bool>();
}

Result<KeyValue> ParseKeyValue(const json& obj) {
  if (!obj.is_object()) return Status::Corruption("a kv is not an object");
  KeyValue kv;
  TESSERA_ASSIGN_OR_RETURN(kv.key, Base64Field(obj, "key"));
  TESSERA_ASSIGN_OR_RETURN(kv.value, Base64Field(obj, "value"));
  TESSERA_ASSIGN_OR_RETURN(kv.create_revision, Int64Field(obj, "create_revision"));
  TESSERA_ASSIGN_OR_RETURN(kv.mod_revision, Int64Field(obj, "mod_revision"));
  TESSERA_ASSIGN_OR_RETURN(kv.version, Int64Field(obj, "version"));
  TESSERA_ASSIGN_OR_RETURN(kv.lease, Int64Field(obj, "lease"));
  return kv;
}

Result<std::vector<KeyValue>> ParseKvs(const json& obj) {
  std::vector<KeyValue> out;
  auto it = obj.find("kvs");
  if (it == obj.end()) return out;
  if (!it->is_array()) return Status::Corruption("kvs is not an array");
  for (const json& e : *it) {
    TESSERA_ASSIGN_OR_RETURN(KeyValue kv, ParseKeyValue(e));
    out.push_back(std::move(kv));
  }
  return out;
}

Result<int64_t> HeaderRevision(const json& obj) {
  auto it = obj.find("header");
  if (it == obj.end() || !it->is_object()) return Status::Corruption("no header in the answer");
  return Int64Field(*it, "revision");
}

StatusCode CodeOfGrpc(int grpc_code) {
  switch (grpc_code) {
    case 1:
      return StatusCode::kCancelled;
    case 3:
      return StatusCode::kInvalidArgument;
    case 4:
      return StatusCode::kDeadlineExceeded;
    case 5:
      return StatusCode::kNotFound;
    case 6:
      return StatusCode::kAlreadyExists;
    case 8:
      return StatusCode::kResourceExhausted;
    case 9:   // FailedPrecondition
    case 11:  // OutOfRange: a revision etcd compacted away
      return StatusCode::kFailedPrecondition;
    case 14:
      return StatusCode::kUnavailable;
    default:
      return StatusCode::kInternal;
  }
}

Result<json> ParseJson(std::string_view text, std::string_view what) {
  // The non-throwing parse: the library never lets an exception out.
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return Status::Corruption(std::string(what) + ": not JSON: \"" + Excerpt(text) + "\"");
  }
  return j;
}

Status HttpError(int http_status, std::string_view body, std::string_view what) {
  json j = json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_string()) {
    int code = j.contains("code") && j["code"].is_number_integer() ? j["code"].get<int>() : 2;
    return Status(CodeOfGrpc(code), std::string(what) + ": etcd: " + j["error"].get<std::string>() +
                                        " (HTTP " + std::to_string(http_status) + ")");
  }
  return Status::Internal(std::string(what) + ": HTTP " + std::to_string(http_status) + ": \"" +
                          Excerpt(body) + "\"");
}

}  // namespace tessera::internal
