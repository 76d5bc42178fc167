// backend=cuda with a KV cache's leftpad (flash-attn's cache_leftpad) and
// rotary embedding (rotary_cos/rotary_sin), beyond the shared lists that the
// CudaDecode suites check against the oracle (kv_cache_option_cases,
// decode_option_cases): what a leftpad's rows hold reaches nothing (two
// different fills give the same bits) and is never written; the rotated keys
// the append writes are backend cpu's bit for bit (both rotate in fp32
// without fused multiply-adds and round once); bad leftpads are refused by
// name with nothing written, or, unchecked, stay in bounds; auto runs these
// calls on cuda (cudnn refuses them). (Their compute-sanitizer cases are in
// decode_gpu_test.cpp's Sanitize list.)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/decode_cases.hpp"
#include "common/kv_cache_checks.hpp"
#include "device_runner.hpp"

namespace cuflash::test {
namespace {

// ----- a leftpad's rows ---------------------------------------------------------------------

// The rows before each leftpad (and the slack after each sequence) filled with
// `sentinel`; the call must match the oracle, leave them as they were, and
// give the bits it gives with another fill.
TEST(CudaKvLeftpad, PaddingRowsReachNothingAndStayUnwritten) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  for (const bool split : {false, true}) {
    SCOPED_TRACE(split ? "split" : "unsplit");
    CaseSpec s = split ? decode_case("leftpad_fill_split", 0, 1, 1, {3000}, 8, 2, 128)
                       : decode_case("leftpad_fill", 0, 3, 3, {300, 64, 70, 129}, 8, 2, 128);
    s.leftpad = split ? std::vector<int>{1234} : std::vector<int>{100, 64, 1, 65};
    s.rotary_dim = 64;
    s.dtype = DType::bf16;
    s.poison_unused = false;
    AttentionCase small_fill(s, rng.engine());
    AttentionCase large_fill = small_fill;
    constexpr double kSmall = -3.0, kLarge = 2048.0;  // exact in f16 and bf16; 2048 would dominate any score
    ASSERT_GT(fill_unowned_cache_rows(small_fill, kSmall), 0);
    fill_unowned_cache_rows(large_fill, kLarge);
    DeviceRunner runner;
    check_forward_gpu(small_fill, runner);
    check_forward_gpu(large_fill, runner);
    EXPECT_EQ(count_unowned_cache_changes(small_fill, kSmall), 0) << "a leftpad's (or the slack's) rows changed";
    EXPECT_EQ(count_unowned_cache_changes(large_fill, kLarge), 0) << "a leftpad's (or the slack's) rows changed";
    EXPECT_EQ(count_output_differences(small_fill, large_fill), 0)
        << "elements of out/lse that depend on what the rows before the leftpad hold";
  }
}

// ----- the rotated append -------------------------------------------------------------------

// The same case on backend cpu and backend cuda, for GPT-NeoX and GPT-J pairs
// over whole 16-byte chunks and over part of one: the caches afterwards (the
// rotated keys in their slots) are equal bit for bit, and both outputs match
// the oracle.
TEST(CudaKvRotary, AppendedKeysAreBackendCpusBitForBit) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  const struct {
    const char* label;
    int page_size, rotary_dim;
    bool interleaved;
    DType dtype;
  } variants[] = {{"paged16_neox64_bf16", 16, 64, false, DType::bf16},
                  {"paged16_interleaved128_f16", 16, 128, true, DType::f16},
                  {"contiguous_neox40_f16", 0, 40, false, DType::f16},
                  {"contiguous_interleaved20_bf16", 0, 20, true, DType::bf16}};
  for (const auto& variant : variants) {
    SCOPED_TRACE(variant.label);
    CaseSpec s = decode_case(std::string("rotary_") + variant.label, variant.page_size, 4, 4, {300, 0, 1000}, 8, 2,
                             128);
    s.rotary_dim = variant.rotary_dim;
    s.rotary_interleaved = variant.interleaved;
    s.dtype = variant.dtype;
    AttentionCase on_gpu(s, rng.engine());
    AttentionCase on_cpu = on_gpu;
    DeviceRunner gpu;
    HostApiRunner cpu(Backend::cpu);
    check_forward_gpu(on_gpu, gpu);
    check_forward(on_cpu, cpu);
    EXPECT_TRUE(same_bytes(on_gpu.k, on_cpu.k)) << "the K caches differ between backends cuda and cpu";
    EXPECT_TRUE(same_bytes(on_gpu.v, on_cpu.v)) << "the V caches differ between backends cuda and cpu";
  }
}

// ----- bad leftpads ---------------------------------------------------------------------------

// A valid contiguous case whose leftpad (in GPU memory, copied to the host by
// validation) is then broken: invalid_argument naming it, nothing written
// (the append included).
TEST(CudaKvLeftpadBadInput, RefusedWithNothingWritten) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  const struct {
    const char* label;
    int index, value;
    const char* must_mention;
  } breaks[] = {{"past_the_cached_keys", 1, 51, "kv_cache.leftpad: leftpad[1] = 51 exceeds seqlens_k[1] = 50"},
                {"negative", 0, -1, "kv_cache.leftpad: leftpad[0] = -1 is negative"}};
  for (const auto& broken : breaks) {
    SCOPED_TRACE(broken.label);
    CaseSpec s = decode_case(broken.label, 0, 1, 3, {20, 50}, 8, 2, 128);
    s.leftpad = {5, 10};
    s.rotary_dim = 32;
    s.dtype = DType::bf16;
    AttentionCase c(s, rng.engine());
    c.leftpad.set(broken.index, broken.value);
    const AttentionCase before = c;
    DeviceRunner runner;
    const Status status = runner.forward(c, c.options(Backend::cuda));
    EXPECT_EQ(status.code(), StatusCode::invalid_argument) << status.to_string();
    EXPECT_NE(status.message().find(broken.must_mention), std::string::npos) << status.message();
    expect_case_unchanged(before, c);
  }
}

// With check_index_contents off nothing reads the leftpad on the host; bad
// values give wrong results but no access outside the tensors (the runner's
// guard bytes, and compute-sanitizer under gpu-check.sh, would show one).
TEST(SanitizeCudaKvLeftpadUnchecked, BadLeftpadsStayInBounds) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  CaseSpec s = decode_case("unchecked_bad_leftpad", 0, 2, 2, {20, 50, 7}, 8, 2, 128);
  s.leftpad = {0, 0, 0};
  s.rotary_dim = 64;
  s.dtype = DType::bf16;
  s.options.check_index_contents = false;
  AttentionCase c(s, rng.engine());
  c.leftpad.set(0, -7);       // before the cache
  c.leftpad.set(1, 1 << 30);  // far past the cached keys
  c.seqlens_k.set(2, 1 << 30);  // a length far past the capacity, with a valid leftpad
  DeviceRunner runner;
  const Status status = runner.forward(c, c.options(Backend::cuda));
  EXPECT_TRUE(status.ok()) << status.to_string();
}

// ----- auto ---------------------------------------------------------------------------------

// cudnn refuses a leftpad and a rotary embedding by name: auto runs them on cuda.
TEST(CudaKvOptionsAuto, LeftpadAndRotaryRunOnCuda) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  CaseSpec leftpad = decode_case("auto_leftpad_decode", 0, 1, 0, {300, 5, 77}, 8, 2, 128);
  leftpad.leftpad = {10, 5, 0};
  CaseSpec rotary = decode_case("auto_rotary_append", 16, 1, 1, {300, 0, 77}, 8, 2, 128);
  rotary.rotary_dim = 128;
  for (CaseSpec* s : {&leftpad, &rotary}) {
    SCOPED_TRACE(s->label);
    s->dtype = DType::f16;
    AttentionCase c(*s, rng.engine());
    DeviceRunner runner(Backend::automatic);
    check_forward_gpu(c, runner);
  }
}

}  // namespace
}  // namespace cuflash::test
