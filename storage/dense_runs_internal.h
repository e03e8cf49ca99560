// The dense chunks of a memory-only lane, kept in runs: the values of several chunks of one
// lane side by side in one block, so that a pull of them can leave as one frame (no copy).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "ps/optimizer.h"
#include "ps/routing.h"
#include "ps/table_spec.h"
#include "storage/storage.h"

namespace tessera::internal {

/// One table's dense chunks in one lane. The chunks this lane serves (LaneOfChunk(table_id,
/// chunk, lanes) == lane, i.e. every `lanes`-th chunk) are grouped into runs of RunSlots(lanes)
/// consecutive lane chunks (together about 1 MiB of the table, the client's default request);
/// a run holds its chunks' values in one block, chunk after chunk, and their optimizer state
/// and metadata apart. Any other chunk (a store used outside a server's lane layout) is a run
/// of its own. Chunks are created with the initializer on first use.
///
/// Copy-on-write by run: Share() and Freeze() hand out the run; a later write to any chunk of a
/// run still held (or a chunk created in it) first replaces the run by a copy, so what a holder
/// sees never changes. Not thread-safe: the lane's thread calls everything; holders of shares
/// and frozen runs read them on any thread.
class DenseRuns {
 public:
  struct Run {
    uint64_t first_chunk = 0;               // chunk of slot 0
    uint32_t stride = 1;                    // chunk of slot i: first_chunk + i * stride
    std::vector<float> values;              // slot i's values at i * kDenseChunkFloats
    std::vector<std::vector<float>> state;  // per slot (empty: no optimizer state)
    std::vector<RowMeta> meta;              // per slot
    uint64_t chunk(uint32_t slot) const { return first_chunk + uint64_t{slot} * stride; }
  };
  /// A run as frozen, and which of its chunks existed then (1 per slot).
  using Frozen = std::vector<std::pair<std::shared_ptr<const Run>, std::vector<uint8_t>>>;

  /// Lane chunks per run on a server of `lanes` lanes: 16 table chunks' worth (1 MiB).
  static uint32_t RunSlots(uint32_t lanes) { return lanes >= 16 ? 1 : (16 + lanes - 1) / lanes; }

  DenseRuns(const TableSpec& spec, const Optimizer* opt, uint64_t table_id, uint32_t lane,
            uint32_t lanes);

  /// A chunk opened for writing: its values, state (StateFloats(len) floats) and metadata.
  struct Chunk {
    float* values;
    float* state;
    RowMeta* meta;
    uint32_t len;
  };
  /// Chunk `chunk` (< the table's chunk count) for writing; copies its run first if held.
  Chunk Get(uint64_t chunk);
  /// Its values for reading now (`*len` floats).
  const float* Read(uint64_t chunk, uint32_t* len);
  /// Its values as they are now, for a holder on any thread (see the class comment). The
  /// values of the next chunk of the run follow at `result + *len` when `*len` is a whole chunk
  /// and that chunk exists: shares of neighbours are adjacent in memory and have one owner.
  std::shared_ptr<const float> Share(uint64_t chunk, uint32_t* len);
  /// fn(chunk, values, state, meta) for every created chunk.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (const auto& [key, e] : runs_) VisitRun(*e.run, e.present, fn);
  }
  /// The same for the chunks of `r` that `present` marks.
  template <typename Fn>
  static void VisitRun(const Run& r, const std::vector<uint8_t>& present, Fn&& fn) {
    for (uint32_t s = 0; s < present.size(); ++s) {
      if (present[s]) {
        fn(r.chunk(s), r.values.data() + size_t{s} * kDenseChunkFloats, r.state[s].data(),
           r.meta[s]);
      }
    }
  }
  uint64_t MemoryBytes() const;
  Frozen Freeze() const;

 private:
  // A run and which of its chunks exist. A run is created with all its chunks initialized
  // (so that creating one later writes nothing a holder may read); `present` is the lane's own.
  struct Entry {
    std::shared_ptr<Run> run;
    std::vector<uint8_t> present;
  };
  // The run of `chunk` and its slot, created if absent; the run is this table's alone when
  // `write`. Marks the chunk present.
  std::pair<Run*, uint32_t> Slot(uint64_t chunk, bool write, std::shared_ptr<Run>** owner);

  TableSpec spec_;
  const Optimizer* opt_;
  uint64_t chunks_;  // chunks of the table
  uint32_t lanes_;
  uint64_t residue_;  // chunk % lanes_ of this lane's chunks
  uint32_t run_slots_;
  // Key: 2 * run index for this lane's runs, 2 * chunk + 1 for a chunk of another lane.
  absl::flat_hash_map<uint64_t, Entry> runs_;
};

}  // namespace tessera::internal
