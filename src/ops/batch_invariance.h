// Batch invariance: whether every op must give a row the same bits whatever else is in the batch.
//
// On (the default): the kernel an op runs may depend on the weight's format and shape and on the
// numerics, never on the number of rows, so a request's logits do not depend on its neighbours
// (DEEPINFER_BATCH_INVARIANT=1, EngineArgs::batch_invariant). Off: a backend may choose kernels by
// the number of rows — the GPU's large GEMMs then run on kernels whose summation order differs
// from the decode kernels' (the products are the same quantized operands; docs/CUDA.md, "Batch
// invariance off"). The CPU kernels have one reduction order per output either way.
//
// Process-wide: the engine sets it from its arguments; programs without an engine (tests,
// benches) get DEEPINFER_BATCH_INVARIANT's value (0 or 1, unset: 1; another value is an Error
// naming the variable).
#pragma once

namespace deepinfer::ops {

bool batch_invariant();
void set_batch_invariant(bool on);

// Sets the policy for a scope and restores the previous one at its end (tests, benches).
class ScopedBatchInvariance {
 public:
  explicit ScopedBatchInvariance(bool on) : previous_(batch_invariant()) {
    set_batch_invariant(on);
  }
  ~ScopedBatchInvariance() { set_batch_invariant(previous_); }
  ScopedBatchInvariance(const ScopedBatchInvariance&) = delete;
  ScopedBatchInvariance& operator=(const ScopedBatchInvariance&) = delete;

 private:
  bool previous_;
};

}  // namespace deepinfer::ops
