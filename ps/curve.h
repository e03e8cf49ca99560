// CurveZMQ keys: optional encryption and authentication of every Tessera connection.
#pragma once

#include <string>

#include "ps/status.h"

namespace tessera {

/// A CurveZMQ key pair in Z85 text (40 characters each), for ServerOptions::curve_secret_key
/// and ClientOptions::curve_server_key.
struct CurveKeyPair {
  std::string public_key;
  std::string secret_key;
};

/// A fresh key pair. FailedPrecondition when libzmq was built without CurveZMQ.
Result<CurveKeyPair> GenerateCurveKeyPair();

/// Reads a key from a file: its first whitespace-separated word, which must have 40 characters
/// (keys stay out of command lines and process listings).
Result<std::string> ReadCurveKeyFile(const std::string& path);

}  // namespace tessera
