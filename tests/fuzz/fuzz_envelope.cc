// libFuzzer target: the envelope decoder (ps/codec.h DecodeHeader), on the raw bytes of a
// frame 0 exactly as a server or client receives it, at an 8-aligned and a misaligned address.
//
// Beyond "no crash, no sanitizer report" it checks that decoding is a function of the bytes
// (both addresses agree) and that whatever decodes re-encodes to an envelope that decodes to
// the same header with the same outcome and encodes to the same bytes again (a fixed point).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ps/codec.h"

namespace tessera {
namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_envelope: invariant failed: %s\n", what);
    std::abort();
  }
}

}  // namespace
}  // namespace tessera

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  // An 8-aligned copy, and one at an odd address (the decoder copies misaligned envelopes).
  std::vector<uint64_t> aligned(size / 8 + 2);
  std::memcpy(aligned.data(), data, size);
  std::vector<char> odd(size + 1);
  std::memcpy(odd.data() + 1, data, size);

  Header a;
  const Status sa = DecodeHeader(aligned.data(), size, &a);
  Header b;
  const Status sb = DecodeHeader(odd.data() + 1, size, &b);
  Check(sa.code() == sb.code() && sa.message() == sb.message(), "alignment changes the outcome");
  if (!sa.ok()) Check(!sa.message().empty(), "an error without a message");
  // Errors before the envelope is read leave the header as it was; a version mismatch (or a
  // bad op, element type or status) fills it, so a server can answer with the request id.
  const bool filled = sa.ok() || sa.code() == StatusCode::kFailedPrecondition ||
                      sa.message().rfind("unknown ", 0) == 0;
  if (!filled) return 0;

  std::string first;
  EncodeHeader(a, &first);
  std::string second;
  EncodeHeader(b, &second);
  Check(first == second, "the two decodings differ");
  Header c;
  const Status sc = DecodeHeader(first.data(), first.size(), &c);
  Check(sc.code() == sa.code(), "a re-encoded envelope decodes with another outcome");
  Check(c.request_id == a.request_id && c.op == a.op && c.version == a.version,
        "a re-encoded envelope changes its request id, op or version");
  std::string third;
  EncodeHeader(c, &third);
  Check(third == first, "encode(decode(encode(h))) is not encode(h)");
  if (sa.ok() && a.spec) {
    // Stored specs travel as envelopes (EncodeTableSpec): the same fixed point.
    Result<TableSpec> spec = DecodeTableSpec(EncodeTableSpec(*a.spec));
    Check(spec.ok(), "an encoded spec does not decode");
    Check(EncodeTableSpec(*spec) == EncodeTableSpec(*a.spec), "a spec does not round-trip");
  }
  return 0;
}
