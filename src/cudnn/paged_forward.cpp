// Paged KV cache in the forward graph: K and V are containers of pages
// [num_pages, Hk, page_size, D] (sdpa_plan.cpp), and cuDNN finds sequence b's
// key j in page page_table[b][j / page_size] at row j % page_size, exactly
// our block_table; both tables are the caller's block_table. The true key
// counts come from seqlens_k through the padding mask (the plan's
// caller_seqlens_k), bounded by the cache capacity (max_pages * page_size).
#include "frontend.hpp"

namespace cuflash::detail::cudnn {

void add_page_tables(FeGraph& graph, const SdpaPlan& plan, fe::graph::SDPA_attributes& attributes) {
  auto table = [&](const char* name, std::int64_t id) {
    return graph.tensor(fe::graph::Tensor_attributes()
                            .set_name(name)
                            .set_uid(id)
                            .set_dim({plan.batch, 1, plan.page_table_cols, 1})
                            .set_stride({plan.page_table_row_stride, plan.page_table_row_stride, 1, 1})
                            .set_data_type(fe::DataType_t::INT32));
  };
  attributes.set_paged_attention_k_table(table("page_table_k", uid::page_table_k))
      .set_paged_attention_v_table(table("page_table_v", uid::page_table_v))
      .set_paged_attention_max_seq_len_kv(static_cast<int>(plan.max_seq_len_kv));
}

}  // namespace cuflash::detail::cudnn
