#include "ps/curve.h"

#include <zmq.h>

#include <fstream>
#include <sstream>

namespace tessera {

Result<CurveKeyPair> GenerateCurveKeyPair() {
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0) {
    return Status::FailedPrecondition("this libzmq has no CurveZMQ support");
  }
  return CurveKeyPair{std::string(pub, 40), std::string(sec, 40)};
}

Result<std::string> ReadCurveKeyFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::IOError("cannot read key file '" + path + "'");
  std::string key;
  in >> key;
  if (key.size() != 40) {
    return Status::InvalidArgument("key file '" + path + "' does not hold a 40-character Z85 key");
  }
  return key;
}

namespace {

bool IsZ85Key(const std::string& key) {
  uint8_t raw[32];
  return key.size() == 40 && zmq_z85_decode(raw, key.c_str()) != nullptr;
}

}  // namespace

Result<std::string> CurvePublicKey(const std::string& secret_key) {
  char pub[41] = {};
  if (!IsZ85Key(secret_key) || zmq_curve_public(pub, secret_key.c_str()) != 0) {
    return Status::InvalidArgument(
        "a CurveZMQ secret key has 40 Z85 characters, got " + std::to_string(secret_key.size()) +
        (secret_key.size() == 40 ? " that are not all Z85" : ""));
  }
  return std::string(pub, 40);
}

Result<std::vector<std::string>> ReadCurveKeyList(const std::string& path) {
  constexpr std::streamsize kMaxBytes = 1 << 20;
  std::ifstream in(path);
  if (!in) return Status::IOError("cannot read key list '" + path + "'");
  std::string text(kMaxBytes + 1, '\0');
  in.read(text.data(), kMaxBytes + 1);
  if (in.bad()) return Status::IOError("cannot read key list '" + path + "'");
  if (in.gcount() > kMaxBytes) {
    return Status::InvalidArgument("key list '" + path + "' is over 1 MiB");
  }
  text.resize(static_cast<size_t>(in.gcount()));
  std::vector<std::string> keys;
  std::istringstream lines(text);
  std::string line;
  for (int n = 1; std::getline(lines, line); ++n) {
    std::istringstream words(line);
    std::string key;
    if (!(words >> key) || key[0] == '#') continue;
    if (!IsZ85Key(key)) {
      return Status::InvalidArgument("key list '" + path + "', line " + std::to_string(n) +
                                     ": '" + key.substr(0, 48) +
                                     "' is not a 40-character Z85 public key");
    }
    keys.push_back(key);
  }
  return keys;
}

}  // namespace tessera
