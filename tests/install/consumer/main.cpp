// Uses an installed cuflash: one tiny attention on the CPU, whose answer is
// worked out by hand. softmax_scale = ln 3 makes the weights exact quarters:
// q0 = [1, 0] scores the keys k0 = [1, 0], k1 = [0, 1] as ln 3 and 0, so
// p = [3/4, 1/4]; q1 = [0, 1] gives p = [1/4, 3/4]. With v0 = [1, 2],
// v1 = [3, 4]:
//   full:   out0 = [1.5, 2.5], out1 = [2.5, 3.5], lse = [ln 4, ln 4]
//   causal: row 0 sees only key 0: out0 = [1, 2], lse0 = ln 3; row 1 as above.
#include <cmath>
#include <cstdio>

#include <cuflash/cuflash.hpp>

namespace {

bool close(float got, double want, const char* what) {
  if (std::isfinite(got) && std::abs(got - want) <= 1e-5) return true;
  std::fprintf(stderr, "%s: got %.8g, expected %.8g\n", what, got, want);
  return false;
}

bool attend(bool causal, const float (&want_out)[4], const float (&want_lse)[2]) {
  float q[4] = {1, 0, 0, 1}, k[4] = {1, 0, 0, 1}, v[4] = {1, 2, 3, 4};
  float out[4] = {}, lse[2] = {};
  cuflash::ForwardArgs args;
  args.q = cuflash::make_view(q, cuflash::DType::f32, {1, 2, 1, 2});  // [B, S, H, D]
  args.k = cuflash::make_view(k, cuflash::DType::f32, {1, 2, 1, 2});
  args.v = cuflash::make_view(v, cuflash::DType::f32, {1, 2, 1, 2});
  args.out = cuflash::make_view(out, cuflash::DType::f32, {1, 2, 1, 2});
  args.lse = cuflash::make_view(lse, cuflash::DType::f32, {1, 1, 2});  // [B, H, S]
  cuflash::AttentionOptions options;
  options.softmax_scale = static_cast<float>(std::log(3.0));
  options.causal = causal;
  options.backend = cuflash::Backend::cpu;
  const cuflash::Status status = cuflash::attention_forward(args, options);
  if (!status.ok()) {
    std::fprintf(stderr, "attention_forward: %s\n", status.to_string().c_str());
    return false;
  }
  bool ok = true;
  for (int i = 0; i < 4; ++i) ok = close(out[i], want_out[i], causal ? "causal out" : "out") && ok;
  for (int i = 0; i < 2; ++i) ok = close(lse[i], want_lse[i], causal ? "causal lse" : "lse") && ok;
  return ok;
}

}  // namespace

int main() {
  const float ln3 = static_cast<float>(std::log(3.0)), ln4 = static_cast<float>(std::log(4.0));
  const bool ok = attend(false, {1.5f, 2.5f, 2.5f, 3.5f}, {ln4, ln4}) && attend(true, {1.0f, 2.0f, 2.5f, 3.5f}, {ln3, ln4});
  std::printf("cuflash %s consumer: %s\n", cuflash::version(), ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
