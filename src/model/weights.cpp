// Loading a checkpoint: config.json, then every *.safetensors shard memory-mapped read-only,
// then the tensors each layer needs bound by their Hugging Face names with shapes checked.
// Weights are never copied or converted here; kernels read them in their stored type.
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

#include "checkpoint/checkpoint.h"
#include "model/model.h"
#include "util/util.h"

namespace kvaudit::model {

namespace fs = std::filesystem;

std::string_view weight_type_name(WeightType type) {
  switch (type) {
    case WeightType::f32:
      return "F32";
    case WeightType::bf16:
      return "BF16";
    case WeightType::f16:
      return "F16";
  }
  return "?";
}

// One read-only mapping of a whole shard file.
struct Model::Mapping {
  void* base = nullptr;
  size_t bytes = 0;
  ~Mapping() {
    if (base != nullptr) munmap(base, bytes);
  }
};

namespace {

struct BoundTensor {
  const uint8_t* data = nullptr;
  checkpoint::TensorInfo info;
  std::string file;
};

Matrix to_matrix(const BoundTensor& tensor, int64_t rows, int64_t cols) {
  Matrix m;
  m.data = tensor.data;
  m.rows = rows;
  m.cols = cols;
  switch (tensor.info.dtype) {
    case checkpoint::TensorDType::F32:
      m.type = WeightType::f32;
      break;
    case checkpoint::TensorDType::BF16:
      m.type = WeightType::bf16;
      break;
    case checkpoint::TensorDType::F16:
      m.type = WeightType::f16;
      break;
    default:
      throw InputError(tensor.file,
                       fmt::format("tensor {} has dtype {}; the reference engine reads F32, BF16 "
                                   "and F16 weights only",
                                   tensor.info.name, checkpoint::dtype_name(tensor.info.dtype)));
  }
  return m;
}

}  // namespace

namespace {

std::unique_ptr<Model::Mapping> map_file(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(path.string(), fmt::format("cannot open: {}", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw InputError(path.string(), "cannot stat");
  }
  auto mapping = std::make_unique<Model::Mapping>();
  mapping->bytes = static_cast<size_t>(st.st_size);
  if (mapping->bytes > 0) {
    void* base = ::mmap(nullptr, mapping->bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (base == MAP_FAILED) {
      ::close(fd);
      throw InputError(path.string(), fmt::format("cannot map: {}", std::strerror(errno)));
    }
    mapping->base = base;
  }
  ::close(fd);
  return mapping;
}

// Every shard mapped (the mappings kept in `mappings`), and each tensor's bytes in them by
// name.
std::map<std::string, BoundTensor> map_shards(
    const std::vector<fs::path>& shards, std::vector<std::unique_ptr<Model::Mapping>>& mappings) {
  std::map<std::string, BoundTensor> tensors;
  for (const fs::path& shard : shards) {
    checkpoint::SafetensorsHeader header = checkpoint::read_safetensors_header(shard);
    mappings.push_back(map_file(shard));
    const Model::Mapping& mapping = *mappings.back();
    if (mapping.bytes != header.file_bytes)
      throw InputError(shard.string(), "file size changed while reading");
    const auto* base = static_cast<const uint8_t*>(mapping.base) + header.data_offset();
    for (const checkpoint::TensorInfo& info : header.tensors) {
      BoundTensor bound{base + info.data_begin, info, shard.string()};
      if (!tensors.emplace(info.name, bound).second)
        throw InputError(shard.string(), fmt::format("tensor {} appears in two shards", info.name));
    }
  }
  return tensors;
}

// The checkpoint's parts the text-only reference engine does not run (a vision tower, a
// multi-token-prediction head), as notes.
void note_parts_not_run(const std::map<std::string, BoundTensor>& tensors,
                        std::vector<std::string>& notes) {
  size_t vision = 0, mtp = 0;
  for (const auto& [name, tensor] : tensors) {
    vision += name.starts_with("model.visual.") || name.starts_with("visual.");
    mtp += name.starts_with("mtp.");
  }
  if (vision > 0)
    notes.push_back(fmt::format("vision tower ({} tensors) not run: text only", vision));
  if (mtp > 0)
    notes.push_back(fmt::format(
        "multi-token-prediction head ({} tensors) not run: no speculative drafts", mtp));
}

}  // namespace

std::unique_ptr<Model> Model::load(const fs::path& dir) {
  // config.json through checkpoint/ (the one reader), and the shards it lists: the index's
  // when there is one, so a scales-only file written beside the shards is not mapped.
  checkpoint::ReadOptions config_only;
  config_only.read_safetensors = false;
  if (!fs::is_directory(dir)) throw InputError(dir.string(), "not a checkpoint folder");
  const checkpoint::ModelFacts facts = checkpoint::read_checkpoint(dir, config_only);
  const std::string label = facts.config_file;
  std::unique_ptr<Model> model(new Model());
  model->dir_ = dir;
  model->config_ = model_config_from(facts, label);
  const ModelConfig& c = model->config_;

  std::vector<fs::path> shards;
  for (const std::string& name : checkpoint::list_shards(dir)) shards.push_back(dir / name);
  if (shards.empty()) throw InputError(dir.string(), "no *.safetensors files (weights) found");

  std::map<std::string, BoundTensor> tensors = map_shards(shards, model->mappings_);

  auto bind = [&](const std::string& name, std::vector<int64_t> shape) -> Matrix {
    auto it = tensors.find(name);
    if (it == tensors.end()) throw InputError(dir.string(), fmt::format("missing tensor {}", name));
    const auto& info = it->second.info;
    bool same = info.shape.size() == shape.size();
    for (size_t i = 0; same && i < shape.size(); ++i)
      same = static_cast<int64_t>(info.shape[i]) == shape[i];
    if (!same) {
      std::vector<std::string> want, got;
      for (int64_t v : shape) want.push_back(std::to_string(v));
      for (uint64_t v : info.shape) got.push_back(std::to_string(v));
      throw InputError(it->second.file,
                       fmt::format("tensor {} has shape [{}], the config implies [{}]", name,
                                   fmt::join(got, ", "), fmt::join(want, ", ")));
    }
    model->weight_bytes_ += info.data_end - info.data_begin;
    int64_t rows = 1;  // every dimension but the last ([conv_width, 1, kernel] -> rows x kernel)
    for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
    return to_matrix(it->second, rows, shape.back());
  };

  const int64_t hidden = c.hidden_size, hd = c.head_dim;
  const int64_t q_width = c.num_heads * hd, kv_width = c.num_kv_heads * hd;
  // Qwen3_5ForConditionalGeneration keeps the language model under model.language_model.
  const std::string base = tensors.count("model.language_model.embed_tokens.weight") != 0
                               ? "model.language_model."
                               : "model.";
  note_parts_not_run(tensors, model->notes_);
  model->embedding_ = bind(base + "embed_tokens.weight", {c.vocab_size, hidden});
  model->final_norm_ = bind(base + "norm.weight", {hidden});
  if (tensors.count("lm_head.weight") != 0 && !c.tie_word_embeddings) {
    model->lm_head_ = bind("lm_head.weight", {c.vocab_size, hidden});
  } else {
    model->lm_head_ = model->embedding_;  // tied (or the checkpoint omits the head)
  }
  model->weight_type_ = model->embedding_.type;
  const DeltaNetConfig& d = c.delta_net;
  for (int i = 0; i < c.num_layers; ++i) {
    std::string p = fmt::format("{}layers.{}.", base, i);
    LayerWeights w;
    w.attn_norm = bind(p + "input_layernorm.weight", {hidden});
    w.mlp_norm = bind(p + "post_attention_layernorm.weight", {hidden});
    w.gate = bind(p + "mlp.gate_proj.weight", {c.intermediate_size, hidden});
    w.up = bind(p + "mlp.up_proj.weight", {c.intermediate_size, hidden});
    w.down = bind(p + "mlp.down_proj.weight", {hidden, c.intermediate_size});
    if (c.mixers[i] == Mixer::gated_delta_net) {
      const std::string l = p + "linear_attn.";
      if (tensors.count(l + "in_proj_qkvz.weight") != 0)
        throw InputError(dir.string(),
                         "fused in_proj_qkvz (Qwen3-Next layout) is not supported: "
                         "the reference engine reads Qwen3.5's in_proj_qkv/z/b/a");
      w.in_qkv = bind(l + "in_proj_qkv.weight", {d.conv_width(), hidden});
      w.in_z = bind(l + "in_proj_z.weight", {d.value_width(), hidden});
      w.in_b = bind(l + "in_proj_b.weight", {d.value_heads, hidden});
      w.in_a = bind(l + "in_proj_a.weight", {d.value_heads, hidden});
      w.conv = bind(l + "conv1d.weight", {d.conv_width(), 1, d.conv_kernel});
      if (tensors.count(l + "conv1d.bias") != 0)
        throw InputError(dir.string(), "conv1d bias is not supported (Qwen3.5 has none)");
      w.dt_bias = bind(l + "dt_bias", {d.value_heads});
      w.a_log = bind(l + "A_log", {d.value_heads});
      w.delta_norm = bind(l + "norm.weight", {d.value_head_dim});
      w.delta_out = bind(l + "out_proj.weight", {hidden, d.value_width()});
      model->weight_type_ = w.in_qkv.type;
      model->layers_.push_back(w);
      continue;
    }
    const int64_t q_rows = c.attention_output_gate ? 2 * q_width : q_width;
    w.q = bind(p + "self_attn.q_proj.weight", {q_rows, hidden});
    w.k = bind(p + "self_attn.k_proj.weight", {kv_width, hidden});
    w.v = bind(p + "self_attn.v_proj.weight", {kv_width, hidden});
    w.o = bind(p + "self_attn.o_proj.weight", {hidden, q_width});
    if (c.attention_bias) {
      w.q_bias = bind(p + "self_attn.q_proj.bias", {q_rows});
      w.k_bias = bind(p + "self_attn.k_proj.bias", {kv_width});
      w.v_bias = bind(p + "self_attn.v_proj.bias", {kv_width});
    }
    if (tensors.count(p + "self_attn.o_proj.bias") != 0)
      throw InputError(dir.string(), "o_proj bias is not supported");
    if (c.qk_norm) {
      w.q_norm = bind(p + "self_attn.q_norm.weight", {hd});
      w.k_norm = bind(p + "self_attn.k_norm.weight", {hd});
    }
    model->weight_type_ = w.q.type;
    model->layers_.push_back(w);
  }
  return model;
}

Model::~Model() = default;

}  // namespace kvaudit::model
