// Ring attention's schedule (include/cuflash/ring_schedule.hpp), run without
// communication: every rank's queries attend every rank's K/V block through
// the calls the schedule gives, partials merged with merge_states into fp32
// accumulators; the result must equal attention over the whole sequence
// (backend cpu, f32) for world sizes 1-5, both layouts and every mask kind.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>

#include "common/test_tensors.hpp"
#include "cuflash/cuflash.hpp"

namespace cuflash::test {
namespace {

constexpr int kBatch = 2, kHeadsQ = 4, kHeadsKv = 2, kDim = 16, kChunk = 6;

enum class MaskKind { none, causal, window, causal_window_alibi, alibi };

struct RingSpec {
  int world;
  RingLayout layout;
  MaskKind mask;
};

std::string spec_name(const ::testing::TestParamInfo<RingSpec>& info) {
  const char* masks[] = {"none", "causal", "window_7_3", "causal_window_5_alibi", "alibi"};
  return "w" + std::to_string(info.param.world) + "_" +
         (info.param.layout == RingLayout::zigzag ? "zigzag" : "contiguous") + "_" +
         masks[static_cast<int>(info.param.mask)];
}

HostTensor random_tensor(std::vector<std::int64_t> shape, std::mt19937& engine) {
  HostTensor t(DType::f32, std::move(shape));
  std::normal_distribution<double> normal;
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, normal(engine));
  return t;
}

// Rows [first, first + count) of a [B, S, H, D] tensor (dim 1).
TensorView rows_of(const HostTensor& t, std::int64_t first, std::int64_t count) {
  TensorView v = t.view();
  v.data = static_cast<char*>(v.data) + first * v.strides[1] * static_cast<std::int64_t>(dtype_size(v.dtype));
  v.shape[1] = count;
  return v;
}
// Rows [first, first + count) of a [B, H, S] lse (dim 2).
TensorView lse_rows_of(const HostTensor& t, std::int64_t first, std::int64_t count) {
  TensorView v = t.view();
  v.data = static_cast<char*>(v.data) + first * v.strides[2] * static_cast<std::int64_t>(dtype_size(v.dtype));
  v.shape[2] = count;
  return v;
}

// The chunks of `rank` (in local order) gathered from a whole-sequence [B, S, H, D] tensor.
HostTensor shard_of(const HostTensor& whole, RingLayout layout, int world, int rank) {
  const int chunks = ring_chunks_per_rank(layout);
  const auto& shape = whole.shape();
  HostTensor local(DType::f32, {shape[0], chunks * kChunk, shape[2], shape[3]});
  const std::int64_t row = shape[2] * shape[3];
  for (std::int64_t b = 0; b < shape[0]; ++b)
    for (int c = 0; c < chunks; ++c) {
      const int global = ring_global_chunk(layout, world, rank, c);
      for (int i = 0; i < kChunk; ++i)
        for (std::int64_t e = 0; e < row; ++e)
          local.set((b * chunks * kChunk + c * kChunk + i) * row + e,
                    whole.get((b * shape[1] + global * kChunk + i) * row + e));
    }
  return local;
}

class RingSchedule : public ::testing::TestWithParam<RingSpec> {};

TEST_P(RingSchedule, StepsMergeToWholeSequenceAttention) {
  CUFLASH_TEST_RNG(rng);
  const RingSpec spec = GetParam();
  const int chunks = ring_chunks_per_rank(spec.layout);
  const int seq = spec.world * chunks * kChunk;
  AttentionOptions options;
  options.backend = Backend::cpu;
  RingMask mask;
  if (spec.mask == MaskKind::causal || spec.mask == MaskKind::causal_window_alibi) mask.causal = true;
  if (spec.mask == MaskKind::window) mask.window_left = 7, mask.window_right = 3;
  if (spec.mask == MaskKind::causal_window_alibi) mask.window_left = 5;
  mask.alibi = spec.mask == MaskKind::causal_window_alibi || spec.mask == MaskKind::alibi;
  options.causal = mask.causal;
  options.window_left = mask.window_left;
  options.window_right = mask.window_right;

  const HostTensor q = random_tensor({kBatch, seq, kHeadsQ, kDim}, rng.engine());
  const HostTensor k = random_tensor({kBatch, seq, kHeadsKv, kDim}, rng.engine());
  const HostTensor v = random_tensor({kBatch, seq, kHeadsKv, kDim}, rng.engine());
  HostTensor slopes(DType::f32, {kHeadsQ});
  for (int h = 0; h < kHeadsQ; ++h) slopes.set(h, 0.05 * (h + 1));
  const TensorView alibi = mask.alibi ? slopes.view() : TensorView{};
  HostTensor out(DType::f32, {kBatch, seq, kHeadsQ, kDim}), lse(DType::f32, {kBatch, kHeadsQ, seq});
  ASSERT_TRUE(attention_forward({q.view(), k.view(), v.view(), out.view(), lse.view(), alibi}, options).ok());
  // The whole sequence's lse as [B, S, H, 1], to shard like the rows.
  HostTensor lse_rows(DType::f32, {kBatch, seq, kHeadsQ, 1});
  for (int b = 0; b < kBatch; ++b)
    for (int h = 0; h < kHeadsQ; ++h)
      for (int i = 0; i < seq; ++i) lse_rows.set((b * seq + i) * kHeadsQ + h, lse.get((b * kHeadsQ + h) * seq + i));

  const int local_len = chunks * kChunk;
  for (int rank = 0; rank < spec.world; ++rank) {
    const HostTensor q_local = shard_of(q, spec.layout, spec.world, rank);
    HostTensor acc_out(DType::f32, {kBatch, local_len, kHeadsQ, kDim});
    HostTensor acc_lse(DType::f32, {kBatch, kHeadsQ, local_len});
    for (std::int64_t i = 0; i < acc_lse.numel(); ++i) acc_lse.set(i, -std::numeric_limits<double>::infinity());
    for (int step = 0; step < spec.world; ++step) {
      const int kv_rank = (rank - step + spec.world) % spec.world;
      const HostTensor k_block = shard_of(k, spec.layout, spec.world, kv_rank);
      const HostTensor v_block = shard_of(v, spec.layout, spec.world, kv_rank);
      std::vector<RingCall> calls;
      ASSERT_TRUE(ring_step_calls(spec.layout, spec.world, rank, kv_rank, mask, false, kChunk, &calls).ok());
      for (const RingCall& call : calls) {
        const int rows = call.q_count * kChunk;
        AttentionOptions call_options = options;
        call_options.causal = call.causal;
        call_options.window_left = call.window_left;
        call_options.window_right = call.window_right;
        call_options.diagonal_offset = call.diagonal_offset;
        HostTensor part_out(DType::f32, {kBatch, rows, kHeadsQ, kDim}), part_lse(DType::f32, {kBatch, kHeadsQ, rows});
        const Status status = attention_forward(
            {rows_of(q_local, call.q_first * kChunk, rows), rows_of(k_block, call.k_first * kChunk, call.k_count * kChunk),
             rows_of(v_block, call.k_first * kChunk, call.k_count * kChunk), part_out.view(), part_lse.view(), alibi},
            call_options);
        ASSERT_TRUE(status.ok()) << status.message();
        const TensorView acc_rows = rows_of(acc_out, call.q_first * kChunk, rows);
        const TensorView acc_lse_rows = lse_rows_of(acc_lse, call.q_first * kChunk, rows);
        ASSERT_TRUE(merge_states({acc_rows, acc_lse_rows, part_out.view(), part_lse.view(), acc_rows, acc_lse_rows},
                                 Backend::cpu)
                        .ok());
      }
    }
    const HostTensor out_ref = shard_of(out, spec.layout, spec.world, rank);
    const HostTensor lse_ref = shard_of(lse_rows, spec.layout, spec.world, rank);
    double out_err = 0.0, out_max = 0.0;
    for (std::int64_t i = 0; i < out_ref.numel(); ++i) {
      out_err = std::max(out_err, std::abs(acc_out.get(i) - out_ref.get(i)));
      out_max = std::max(out_max, std::abs(out_ref.get(i)));
    }
    for (int b = 0; b < kBatch; ++b)
      for (int h = 0; h < kHeadsQ; ++h)
        for (int i = 0; i < local_len; ++i) {
          const double want = lse_ref.get((b * local_len + i) * kHeadsQ + h);
          const double got = acc_lse.get((b * kHeadsQ + h) * local_len + i);
          if (std::isinf(want)) {
            EXPECT_EQ(got, want) << "rank " << rank << " b " << b << " h " << h << " row " << i;
          } else {
            EXPECT_NEAR(got, want, 1e-5 * std::max(1.0, std::abs(want)))
                << "rank " << rank << " b " << b << " h " << h << " row " << i;
          }
        }
    EXPECT_LE(out_err, 2e-6 * std::max(1.0, out_max)) << "rank " << rank;
  }
}

std::vector<RingSpec> ring_specs() {
  std::vector<RingSpec> specs;
  for (int world = 1; world <= 5; ++world)
    for (RingLayout layout : {RingLayout::contiguous, RingLayout::zigzag})
      for (MaskKind mask : {MaskKind::none, MaskKind::causal, MaskKind::window, MaskKind::causal_window_alibi,
                            MaskKind::alibi})
        specs.push_back({world, layout, mask});
  return specs;
}

INSTANTIATE_TEST_SUITE_P(Simulated, RingSchedule, ::testing::ValuesIn(ring_specs()), spec_name);

// Zigzag gives every rank the same causal work, one call per step; the
// contiguous layout gives rank r work r + 1/2 (in blocks).
TEST(RingScheduleBalance, ZigzagCausalIsOneCallPerStepAndBalanced) {
  for (int world = 1; world <= 8; ++world) {
    for (int rank = 0; rank < world; ++rank) {
      double blocks = 0.0;
      for (int kv_rank = 0; kv_rank < world; ++kv_rank) {
        std::vector<RingCall> calls;
        ASSERT_TRUE(ring_step_calls(RingLayout::zigzag, world, rank, kv_rank, {true, -1, -1, false}, false, 64, &calls).ok());
        ASSERT_EQ(calls.size(), 1u) << "world " << world << " rank " << rank << " kv_rank " << kv_rank;
        const RingCall& c = calls[0];
        EXPECT_FALSE(c.diagonal_offset.has_value());
        blocks += c.causal ? c.q_count * c.k_count / 2.0 : c.q_count * c.k_count;  // a causal square: half
      }
      EXPECT_DOUBLE_EQ(blocks, 2.0 * world) << "world " << world << " rank " << rank;
    }
  }
}

TEST(RingScheduleBalance, VarlenCallsCoverOneChunkAndNeedNoOffset) {
  for (int world = 1; world <= 4; ++world)
    for (int rank = 0; rank < world; ++rank)
      for (int kv_rank = 0; kv_rank < world; ++kv_rank)
        for (bool causal : {false, true}) {
          std::vector<RingCall> calls;
          ASSERT_TRUE(ring_step_calls(RingLayout::zigzag, world, rank, kv_rank, {causal, -1, -1, false}, true, 0, &calls).ok());
          for (const RingCall& c : calls) {
            EXPECT_EQ(c.q_count, 1);
            EXPECT_EQ(c.k_count, 1);
            EXPECT_FALSE(c.diagonal_offset.has_value());
          }
        }
}

TEST(RingScheduleErrors, NamesTheArgument) {
  std::vector<RingCall> calls;
  auto message = [&](Status s) { return std::string(s.message()); };
  EXPECT_NE(message(ring_step_calls(RingLayout::zigzag, 0, 0, 0, {}, false, 8, &calls)).find("world_size"), std::string::npos);
  EXPECT_NE(message(ring_step_calls(RingLayout::zigzag, 2, 2, 0, {}, false, 8, &calls)).find("rank"), std::string::npos);
  EXPECT_NE(message(ring_step_calls(RingLayout::zigzag, 2, 0, -1, {}, false, 8, &calls)).find("kv_rank"), std::string::npos);
  EXPECT_NE(message(ring_step_calls(RingLayout::zigzag, 2, 0, 1, {false, 4, -1, false}, true, 0, &calls)).find("window_size"),
            std::string::npos);
  EXPECT_NE(message(ring_step_calls(RingLayout::zigzag, 2, 0, 1, {true, -1, -1, true}, true, 0, &calls)).find("alibi_slopes"),
            std::string::npos);
  EXPECT_NE(message(ring_step_calls(RingLayout::zigzag, 2, 0, 1, {}, false, 0, &calls)).find("chunk_len"), std::string::npos);
}

}  // namespace
}  // namespace cuflash::test
