// A loaded model with its backend and a state pool, for tests that run the
// same steps on several backends or load options and compare the logits.
#pragma once

#include <memory>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "models/model.h"
#include "models/state_pool.h"

namespace lair::testing {

struct ModelRunner {
  std::unique_ptr<kernels::Backend> backend;
  std::unique_ptr<models::Model> model;
  std::unique_ptr<models::StatePool> pool;

  // The batch's logits on the host (undefined, with a test failure, on error).
  Tensor Forward(const models::ForwardBatch& batch) {
    auto logits = model->Forward(batch, *pool);
    EXPECT_TRUE(logits.ok()) << logits.status();
    return logits.ok() ? *logits : Tensor();
  }
};

// Loads the model in `dir` on `device` with `options` and a pool of `slots`.
inline ModelRunner LoadRunner(const std::string& dir, const std::string& device,
                              const kernels::BackendOptions& backend_options,
                              const models::LoadOptions& options, int slots = 4) {
  ModelRunner r;
  auto backend = kernels::MakeBackend(device, backend_options);
  EXPECT_TRUE(backend.ok()) << backend.status();
  if (!backend.ok()) return r;
  r.backend = std::move(*backend);
  auto model = models::Model::Load(dir, r.backend.get(), options);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return r;
  r.model = std::move(*model);
  auto pool = models::StatePool::Create(r.backend.get(), r.model->state_layout(), slots);
  EXPECT_TRUE(pool.ok()) << pool.status();
  if (pool.ok()) r.pool = std::make_unique<models::StatePool>(std::move(*pool));
  return r;
}

}  // namespace lair::testing
