// "Run a backend and compare it with the float64 oracle": the shared body of
// the forward and backward correctness tests. Every output is poisoned with
// NaN before the call, so an element left unwritten fails; inputs (and the
// KV cache outside its append slots) must come back bit-identical.
#pragma once

#include "attention_case.hpp"
#include "cpu/float64_oracle.hpp"

namespace cuflash::test {

struct Tolerance {
  // f32: max |got - ref| over the largest |ref| (outputs are O(1)); <0 skips.
  double out_max_abs_rel = -1.0;
  double out_rel_l2 = 0.0;
  // |got - ref| / max(1, |ref|): scores are computed in fp32, so the error of
  // an lse grows with its magnitude (a scale-1 case reaches |lse| ~ 25).
  double lse_max_abs = 0.0;
  double grad_rel_l2 = 0.0;
};

// f32: out max-abs 1e-5 of the output scale, lse 1e-5, gradients 1e-5 rel-L2
// (the CPU backend stays below 1e-6).
// f16/bf16 (inputs already rounded, so only output rounding and fp32
// accumulation differ): out and gradients 3e-3 / 1e-2 rel-L2.
Tolerance default_tolerance(DType dtype);

// How the implementation under test is run on a case's host tensors. The CPU
// suite calls the API on host views; a GPU suite copies to the device and back.
class Runner {
 public:
  virtual ~Runner() = default;
  virtual Backend backend() const = 0;
  virtual Status forward(AttentionCase& c, const AttentionOptions& options) = 0;
  virtual Status backward(AttentionCase& c, const AttentionOptions& options) = 0;
};

class HostApiRunner : public Runner {
 public:
  explicit HostApiRunner(Backend backend) : backend_(backend) {}
  Backend backend() const override { return backend_; }
  Status forward(AttentionCase& c, const AttentionOptions& options) override;
  Status backward(AttentionCase& c, const AttentionOptions& options) override;

 private:
  Backend backend_;
};

struct ForwardErrors {
  ErrorStats out, lse;
};
struct BackwardErrors {
  ErrorStats dq, dk, dv, dsinks;
};

// Runs the forward and adds gtest failures for every disagreement with the
// oracle: out, lse, untouched inputs, KV-cache append slots and guard slots.
ForwardErrors check_forward(AttentionCase& c, Runner& runner, const Tolerance& tolerance);
ForwardErrors check_forward(AttentionCase& c, Runner& runner);

// Feeds the backward the oracle's forward (out rounded to the dtype, lse to
// f32) and compares dq, dk, dv (and dsinks, with sinks) with the oracle's
// analytic gradients.
BackwardErrors check_backward(AttentionCase& c, Runner& runner, const Tolerance& tolerance);
BackwardErrors check_backward(AttentionCase& c, Runner& runner);

// Largest error seen so far per dtype, backend and quantity, printed when the
// test program ends (for reports on how much margin the tolerances leave).
// Backend::automatic: no backend in the key.
void record_error(DType dtype, const char* quantity, double value, Backend backend = Backend::automatic);

}  // namespace cuflash::test
