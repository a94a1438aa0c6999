// log-softmax (numerics.h): the one implementation eval and serve use.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "numerics/numerics.h"

namespace kvaudit::numerics {

void log_softmax(std::span<const float> logits, std::span<float> log_probs) {
  if (log_probs.size() != logits.size()) throw std::logic_error("log_softmax: size mismatch");
  float max_logit = -std::numeric_limits<float>::infinity();
  for (float v : logits) {
    if (std::isnan(v) || v == std::numeric_limits<float>::infinity()) {
      std::fill(log_probs.begin(), log_probs.end(), std::numeric_limits<float>::quiet_NaN());
      return;
    }
    max_logit = std::max(max_logit, v);
  }
  if (max_logit == -std::numeric_limits<float>::infinity()) {  // no finite logit at all
    std::fill(log_probs.begin(), log_probs.end(), std::numeric_limits<float>::quiet_NaN());
    return;
  }
  double sum = 0.0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - max_logit);
  const double log_sum = std::log(sum) + max_logit;
  for (size_t i = 0; i < logits.size(); ++i)
    log_probs[i] = static_cast<float>(static_cast<double>(logits[i]) - log_sum);
}

}  // namespace kvaudit::numerics
