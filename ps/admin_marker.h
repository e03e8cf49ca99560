// The marker files of checkpoints and exports (NAME/CHECKPOINT, NAME/vN/EXPORT): written by
// the client once every server has finished, read by servers (restore, delta exports) and by
// ExportReader. Text: a line "tessera <what>", then one "key value..." line per field. The
// servers that wrote the files are `servers N` and, for a cluster that follows a map (whose
// ids may have gaps: retired ids), `server_ids I1 I2 ...`; without that line they are
// 0..N-1, the layout of a static --cluster.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ps/status.h"

namespace tessera {

struct AdminMarker {
  /// Every field but the first line, by key: the rest of its line.
  std::map<std::string, std::string> fields;
  /// The ids of the servers whose server-<id>/ directories hold the data, ascending.
  std::vector<uint32_t> server_ids;
  /// Field `key` as a number no larger than `max`: Corruption when absent or malformed.
  Result<uint64_t> Number(const std::string& key, uint64_t max = UINT64_MAX) const;
  /// The signed field `key` (a cut clock): Corruption when absent or malformed.
  Result<int64_t> SignedNumber(const std::string& key) const;
};

/// Reads the marker at `path`, whose first line must be "tessera <what>". NotFound when the
/// file does not exist; Corruption, naming the path and the rule, for another first line, a
/// missing or bad `servers`, or a `server_ids` list that is not `servers` ascending ids
/// below 65535. With `inside` (a canonical directory: the admin root), the marker must be a
/// regular file that resolves inside it, not a symbolic link (FailedPrecondition naming the
/// path); a FIFO or device is refused either way, never waited on. At most
/// kMaxAdminMarkerBytes (ResourceExhausted).
inline constexpr uint64_t kMaxAdminMarkerBytes = uint64_t{4} << 20;
Result<AdminMarker> ReadAdminMarker(const std::string& path, std::string_view what,
                                    const std::string& inside = {});

/// The `server_ids` line's value for `ids`: "0 2 3".
std::string FormatServerIds(const std::vector<uint32_t>& ids);

}  // namespace tessera
