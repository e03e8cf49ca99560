// CurveZMQ keys: optional encryption and authentication of every Tessera connection.
#pragma once

#include <string>
#include <vector>

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

/// The public key of a secret key (both Z85 text). InvalidArgument for a secret key that is
/// not 40 Z85 characters.
Result<std::string> CurvePublicKey(const std::string& secret_key);

/// Reads a list of public keys (--authorized_clients, --admin_clients): one Z85 key of 40
/// characters per line; blank lines and lines starting with '#' are skipped, and so is what
/// follows the key on its line (a name). InvalidArgument naming the line for anything else;
/// IOError when the file cannot be read. At most 1 MiB is read (a larger file is refused).
Result<std::vector<std::string>> ReadCurveKeyList(const std::string& path);

}  // namespace tessera
