// Uses only the installed public headers of the client library, included as users do:
// <tessera/client.h> with PREFIX/include as the include root.
#include "plugin.h"

#include <tessera/client.h>

#include <cmath>
#include <cstdio>
#include <vector>

int RunAgainst(const std::string& endpoint) {
  tessera::ClientOptions options;
  options.servers = {endpoint};
  options.connect_timeout_ms = 30000;
  auto client = tessera::Client::Create(options);
  if (!client.ok()) {
    std::fprintf(stderr, "consumer: %s\n", client.status().ToString().c_str());
    return 1;
  }
  // SGD at rate 0.5 on rows that start at 1: one push of g gives 1 - 0.5 g.
  tessera::OptimizerSpec sgd{.kind = tessera::OptimizerKind::kSgd, .learning_rate = 0.5f};
  tessera::InitializerSpec ones{.kind = tessera::InitializerKind::kConstant, .a = 1.0f};
  auto table = (*client)->CreateTable(tessera::TableSpec::Sparse("emb", 4, sgd, ones));
  if (!table.ok()) {
    std::fprintf(stderr, "consumer: %s\n", table.status().ToString().c_str());
    return 1;
  }
  const std::vector<uint64_t> keys = {7, 1ull << 40, 12345};
  std::vector<float> grads(keys.size() * 4);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.25f * static_cast<float>(i);
  tessera::Status s = (*client)->Wait((*client)->Push(*table, keys, grads));
  std::vector<float> rows(keys.size() * 4, -1.0f);
  if (s.ok()) s = (*client)->Wait((*client)->Pull(*table, keys, rows.data()));
  if (!s.ok()) {
    std::fprintf(stderr, "consumer: %s\n", s.ToString().c_str());
    return 1;
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    const float want = 1.0f - 0.5f * grads[i];
    if (std::fabs(rows[i] - want) > 1e-6f) {
      std::fprintf(stderr, "consumer: value %zu is %g, want %g\n", i, rows[i], want);
      return 1;
    }
  }
  std::printf("consumer: OK (%zu keys pushed and pulled)\n", keys.size());
  return 0;
}
