// plan's pool models: one per capacity rule of the engines (how a release turns GPU memory
// into a KV pool), chosen by name by an engine's capacity data (capacity_model). Each is a
// budget, a row per dtype, and a prediction from a start-up log. Internal to plan.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "plan/plan.h"

namespace kvaudit::plan {

// What a forward plan knows when it sizes one engine release.
struct PoolContext {
  const checkpoint::ModelFacts& model;
  const engines::EngineModel& engine;
  engines::Version version;
  const engines::EngineDefaults& defaults;
  const SizingRules& rules;
  const PlanOptions& options;
  double mamba_ratio = 0.9;
  double swa_ratio = 0.8;
  engines::MambaSlotsPerRequest mamba_slots = {};  // state slots per running request
  int page = 1;
};

struct PoolModel {
  std::string_view name;          // the capacity data's capacity_model
  std::string_view budget_label;  // what the budget is, in the engine's terms
  int default_page_size = 1;      // when neither the launch nor the release's defaults say
  // The KV budget per GPU (plan.budget_bytes, its derivation and notes).
  void (*set_budget)(const PoolContext& context, CapacityPlan& plan) = nullptr;
  PlanRow (*row)(const PoolContext& context, const engines::KvDtype& dtype,
                 const CapacityPlan& plan) = nullptr;
  // The engine's printed figures reproduced, and the other dtypes at the same budget.
  void (*predict_from_log)(const checkpoint::ModelFacts& model, const LoggedMemory& logged,
                           const PlanOptions& options, const engines::EngineModel& engine,
                           const engines::Version& version, LogPrediction& out) = nullptr;
  // The KV dtype the printed sizes prove when no line names it (TensorRT-LLM prints bytes
  // per token, never the dtype): canonical name, or "" when they do not decide it.
  std::string (*dtype_from_log)(const checkpoint::ModelFacts& model, const LoggedMemory& logged,
                                const PlanOptions& options, const engines::EngineModel& engine,
                                const engines::Version& version, std::string& evidence) = nullptr;
};

// Every pool model; an engine's capacity data names one of them.
const std::vector<PoolModel>& pool_models();
// The engine's pool model; InputError naming its capacity file when it names none of them.
const PoolModel& pool_model(const engines::EngineModel& engine);

// The pool models' parts (capacity.cpp: SGLang and vLLM; pool_trtllm.cpp: TensorRT-LLM).
void sglang_budget(const PoolContext& context, CapacityPlan& plan);
PlanRow sglang_row(const PoolContext& context, const engines::KvDtype& dtype,
                   const CapacityPlan& plan);
void vllm_budget(const PoolContext& context, CapacityPlan& plan);
PlanRow vllm_row(const PoolContext& context, const engines::KvDtype& dtype,
                 const CapacityPlan& plan);
void predict_sglang(const checkpoint::ModelFacts& model, const LoggedMemory& logged,
                    const PlanOptions& options, const engines::EngineModel& engine,
                    const engines::Version& version, LogPrediction& out);
void predict_vllm(const checkpoint::ModelFacts& model, const LoggedMemory& logged,
                  const PlanOptions& options, const engines::EngineModel& engine,
                  const engines::Version& version, LogPrediction& out);
void trtllm_budget(const PoolContext& context, CapacityPlan& plan);
PlanRow trtllm_row(const PoolContext& context, const engines::KvDtype& dtype,
                   const CapacityPlan& plan);
void predict_trtllm(const checkpoint::ModelFacts& model, const LoggedMemory& logged,
                    const PlanOptions& options, const engines::EngineModel& engine,
                    const engines::Version& version, LogPrediction& out);
std::string trtllm_dtype_from_log(const checkpoint::ModelFacts& model, const LoggedMemory& logged,
                                  const PlanOptions& options, const engines::EngineModel& engine,
                                  const engines::Version& version, std::string& evidence);

// The KV-holding layers of the pipeline rank with the most of them (sizes.cpp).
std::vector<checkpoint::LayerFacts> kv_layers_of_busiest_rank(const checkpoint::ModelFacts& model,
                                                              int pp);

// TensorRT-LLM's KV bytes per token on one GPU (get_cache_size_per_token).
struct TrtllmCell {
  int64_t elements = 0;  // K and V elements per token on the rank
  int64_t bytes_per_token = 0;
  int attention_layers = 0;
  bool mla = false;
  std::vector<std::string> derivation;
};
TrtllmCell trtllm_cell(const checkpoint::ModelFacts& model, const engines::KvDtype& dtype,
                       const Parallelism& parallel);

// Shared by the log predictions: token counts whose printed GiB size rounds to `printed`.
TokenInterval tokens_from_printed_size(double printed, int64_t bytes_per_token,
                                       int64_t padding_tokens);
void add_check(LogPrediction& out, std::string id, std::string what, int64_t printed,
               TokenInterval predicted, std::string derivation);
// The dtypes a log that names none may have used: the model's own, then every dtype the
// release accepts (for deriving it from the printed sizes).
std::vector<const engines::KvDtype*> candidate_dtypes(const checkpoint::ModelFacts& model,
                                                      const engines::EngineModel& engine,
                                                      const engines::Version& version);
std::vector<const engines::KvDtype*> comparable_dtypes(const engines::EngineModel& engine,
                                                       const engines::Version& version,
                                                       const engines::KvDtype& launch_dtype);

}  // namespace kvaudit::plan
