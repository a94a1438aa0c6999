// QkvSource's defaults: one head's part of K/V rows, cut from whole rows.
#include <algorithm>
#include <vector>

#include "quant/quant.h"

namespace kvaudit::quant {
namespace {

template <class ReadRows>
void cut_head(const AttentionShape& shape, int64_t count, int head, std::span<float> out,
              const ReadRows& read_rows) {
  const int64_t dim = shape.head_dim, n = int64_t(shape.kv_heads) * dim;
  thread_local std::vector<float> rows;
  rows.resize(size_t(count * n));
  read_rows(std::span<float>(rows));
  for (int64_t t = 0; t < count; ++t) {
    std::copy_n(rows.data() + t * n + int64_t(head) * dim, dim, out.data() + t * dim);
  }
}

}  // namespace

void QkvSource::head_keys(int64_t first, int64_t count, int head, std::span<float> out) const {
  cut_head(shape(), count, head, out, [&](std::span<float> rows) { keys(first, count, rows); });
}

void QkvSource::head_values(int64_t first, int64_t count, int head, std::span<float> out) const {
  cut_head(shape(), count, head, out, [&](std::span<float> rows) { values(first, count, rows); });
}

}  // namespace kvaudit::quant
