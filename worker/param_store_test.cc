#include "worker/param_store.h"

#include <gtest/gtest.h>

#include "ps/initializer.h"

namespace tessera::worker {
namespace {

TEST(LocalStore, SparseAndDenseFollowTheOptimizerAndInitializer) {
  auto store = CreateLocalStore();
  OptimizerSpec sgd;
  sgd.learning_rate = 0.5f;
  InitializerSpec init;
  init.kind = InitializerKind::kUniform;
  init.a = -1;
  init.b = 1;
  init.seed = 3;
  auto t = store->AddTable(TableSpec::Sparse("emb", 2, sgd, init));
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(store->AddTable(TableSpec::Sparse("emb", 2, sgd, init)).value(), *t);
  EXPECT_EQ(store->AddTable(TableSpec::Sparse("emb", 3, sgd, init)).status().code(),
            StatusCode::kAlreadyExists);
  std::vector<uint64_t> keys = {9, 4};
  std::vector<float> out(4), want(2);
  ASSERT_TRUE(store->Pull(*t, keys, out.data()).Wait().ok());
  InitializeValues(init, 9, 0, 2, want.data());
  EXPECT_EQ(out[0], want[0]);
  EXPECT_EQ(out[1], want[1]);
  ASSERT_TRUE(store->Push(*t, keys, std::vector<float>{1, 2, 0, 0}).Wait().ok());
  std::vector<float> after(4);
  ASSERT_TRUE(store->Pull(*t, keys, after.data()).Wait().ok());
  EXPECT_FLOAT_EQ(after[0], out[0] - 0.5f);
  EXPECT_FLOAT_EQ(after[1], out[1] - 1.0f);
  EXPECT_FLOAT_EQ(after[2], out[2]);

  auto d = store->AddTable(TableSpec::Dense("w", 3, sgd));
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(store->DensePush(*d, 1, std::vector<float>{2, 4}).Wait().ok());
  std::vector<float> w(3);
  ASSERT_TRUE(store->DensePull(*d, 0, 3, w.data()).Wait().ok());
  EXPECT_EQ(w, (std::vector<float>{0, -1, -2}));
  EXPECT_FALSE(store->DensePull(*d, 2, 5, w.data()).Wait().ok());

  ASSERT_TRUE(store->PutMeta("k", "v").ok());
  EXPECT_EQ(store->GetMeta("k").value().value(), "v");
  EXPECT_FALSE(store->GetMeta("none").value().has_value());
  store->Clock().Wait().IgnoreError();
  EXPECT_EQ(store->clock(), 1);
}

}  // namespace
}  // namespace tessera::worker
