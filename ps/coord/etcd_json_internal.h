// The JSON of etcd 3.4's gRPC gateway, shared by the client's calls and its watch thread.
// Keys and values travel as base64; int64 fields as JSON strings; fields equal to their
// default (0, false, empty) are left out of etcd's answers.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "ps/coord/etcd_client.h"
#include "ps/status.h"

namespace tessera::internal {

std::string Base64(std::string_view bytes);

/// Decodes base64 field `name` of `obj` (absent: ""). Corruption naming the field otherwise.
Result<std::string> Base64Field(const nlohmann::json& obj, const char* name);

/// An int64 field sent as a JSON string (or a number); absent: 0. Corruption otherwise.
Result<int64_t> Int64Field(const nlohmann::json& obj, const char* name);

/// A boolean field; absent or not a boolean: false.
bool BoolField(const nlohmann::json& obj, const char* name);

/// A `mvccpb.KeyValue` object.
Result<KeyValue> ParseKeyValue(const nlohmann::json& obj);

/// The `kvs` array of a range answer (absent: no keys).
Result<std::vector<KeyValue>> ParseKvs(const nlohmann::json& obj);

/// The `header.revision` of an answer.
Result<int64_t> HeaderRevision(const nlohmann::json& obj);

/// Maps the gRPC code in an etcd error body ({"error", "code", "message"}) to a Status code.
StatusCode CodeOfGrpc(int grpc_code);

/// Parses one JSON document; Corruption (with the start of `text`) when it is not JSON.
Result<nlohmann::json> ParseJson(std::string_view text, std::string_view what);

/// The error of an HTTP answer that is not 200: etcd's own message when the body is its error
/// JSON, else the status line and the start of the body.
Status HttpError(int http_status, std::string_view body, std::string_view what);

}  // namespace tessera::internal
