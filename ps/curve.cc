#include "ps/curve.h"

#include <zmq.h>

#include <fstream>

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

}  // namespace tessera
