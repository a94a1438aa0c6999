// Loading the engine model: data/engines/<engine>.json and capacity/<engine>.json into
// typed rules (each section read by load_serving.cpp or load_rules.cpp, the whole checked by
// load_lint.cpp), the registry of every engine, and the model's per-version lookups. The lint
// makes a data mistake a one-line error instead of a silently disabled rule (unknown keys,
// malformed version ranges, dtypes a version does not have, unknown scale conventions, log
// templates that do not compile, gaps in the per-version tables).
#include <fmt/format.h>

#include <algorithm>

#include "engines/internal.h"
#include "util/util.h"

namespace kvaudit::engines {

namespace {

using nlohmann::json;

void read_capacity(const std::filesystem::path& file, EngineModel& model) {
  const std::string where = display_path(file);
  json document = read_json_file(file, 1 << 20);
  JsonReader top(document, where);
  model.capacity.file = where;
  if (top.string("engine") != model.engine)
    top.fail("engine", fmt::format("expected \"{}\"", model.engine));
  if (top.integer("schema_version") != 2) top.fail("schema_version", "expected 2");
  model.capacity.model = top.string("capacity_model");  // plan checks it names a pool model
  model.capacity.plan_default_dtypes = top.strings("plan_default_dtypes");
  for (JsonReader& r : top.objects_or_empty("mem_fraction_static_default")) {
    MemFractionTable t;
    t.versions = read_range(r, "versions");
    for (JsonReader& tier : r.objects("tiers")) {
      t.tiers.push_back({tier.number("below_mib"),
                         static_cast<int>(tier.integer("chunked_prefill_size")),
                         static_cast<int>(tier.integer("cuda_graph_max_bs_tp_lt4")),
                         static_cast<int>(tier.integer("cuda_graph_max_bs_tp_ge4"))});
      tier.finish();
    }
    t.reserved_constant_mib = r.number("reserved_constant_mib");
    t.activation_mib_per_prefill_token = r.number("activation_mib_per_prefill_token");
    t.activation_min_tokens = static_cast<int>(r.integer("activation_min_tokens"));
    t.cuda_graph_mib_per_batch = r.number("cuda_graph_mib_per_batch");
    t.parallel_mib_per_rank_over_8 = r.number("parallel_mib_per_rank_over_8");
    t.dp_attention_mib_per_batch_per_dp = r.number("dp_attention_mib_per_batch_per_dp");
    t.large_gpu_threshold_mib = r.number("large_gpu_threshold_mib");
    t.large_gpu_min_reserved_mib = r.number("large_gpu_min_reserved_mib");
    t.round_decimals = static_cast<int>(r.integer("round_decimals"));
    t.caveats = r.string_or("caveats", "");
    t.provenance = read_provenance(r);
    r.finish();
    model.capacity.mem_fraction_tables.push_back(std::move(t));
  }
  if (auto c = top.optional_object("constants")) {
    model.capacity.mamba_pool_padding_slots =
        static_cast<int>(c->integer_or("mamba_pool_padding_slots", 0));
    model.capacity.kv_buffer_padding_pages =
        static_cast<int>(c->integer_or("kv_buffer_padding_pages", 0));
    model.capacity.host_pool_default_ratio = c->number_or("host_pool_default_ratio", 0);
    model.capacity.host_pool_reserve_bytes = c->integer_or("host_pool_reserve_bytes", 0);
    if (model.capacity.host_pool_default_ratio < 0 || model.capacity.host_pool_reserve_bytes < 0)
      c->fail("host_pool_default_ratio", "host pool constants must not be negative");
    c->finish();
  }
  auto references = top.object("references");
  for (const std::string& key : references.keys())
    model.capacity.references[key] = references.string(key);
  references.finish();
  top.allow_descriptive({"notes"});
  top.finish();
}

}  // namespace

EngineModel load_engine_model(const std::filesystem::path& engine_file,
                              const std::filesystem::path& capacity_file,
                              const DtypeVocabulary& dtypes) {
  EngineModel model;
  model.file = display_path(engine_file);
  model.dtypes = &dtypes;
  json document = read_json_file(engine_file, 4 << 20);
  JsonReader top(document, model.file);
  model.engine = top.string("engine");
  if (top.integer("schema_version") != 2) top.fail("schema_version", "expected 2");
  model.latest_known_version = top.string("latest_known_version");
  top.allow_descriptive({"notes", "release_evidence"});
  read_launch(top, model);
  read_rules(top, model);
  top.finish();
  read_capacity(capacity_file, model);
  lint_model(model);
  return model;
}

Registry Registry::load(const std::filesystem::path& data_dir) {
  namespace fs = std::filesystem;
  const fs::path dir = data_dir / "engines";
  Registry registry;
  registry.dtypes_ = std::make_unique<DtypeVocabulary>(load_kv_dtypes(dir / "dtypes.json"));
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  if (ec) throw InputError(display_path(dir), "cannot list the engine data: " + ec.message());
  std::vector<fs::path> files;
  for (; it != end; it.increment(ec)) {
    if (ec) throw InputError(display_path(dir), "cannot list the engine data: " + ec.message());
    const fs::path& path = it->path();
    if (path.extension() == ".json" && path.filename() != "dtypes.json" && it->is_regular_file(ec))
      files.push_back(path);
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& file : files) {
    const std::string name = file.stem().string();
    EngineModel model =
        load_engine_model(file, dir / "capacity" / (name + ".json"), *registry.dtypes_);
    if (model.engine != name)
      throw InputError(model.file, fmt::format("says engine \"{}\"; the file of engine \"{}\" "
                                               "is named {}.json",
                                               model.engine, model.engine, model.engine));
    registry.names_.push_back(name);
    registry.models_.emplace(name, std::move(model));
  }
  if (registry.names_.empty())
    throw InputError(display_path(dir), "holds no engine data (<engine>.json)");
  return registry;
}

const EngineModel* Registry::find(std::string_view name) const {
  auto it = models_.find(name);
  return it == models_.end() ? nullptr : &it->second;
}

const EngineModel& Registry::engine(std::string_view name) const {
  if (const EngineModel* model = find(name)) return *model;
  throw InputError("--engine",
                   fmt::format("unknown engine '{}' (known: {})", name, fmt::join(names_, ", ")));
}

const MemFractionTable* CapacityData::mem_fraction_for(const Version& version) const {
  for (const auto& table : mem_fraction_tables)
    if (table.versions.contains(version)) return &table;
  return nullptr;
}

const LogTemplate* EngineModel::log_template(std::string_view id) const {
  for (const auto& log : log_templates)
    if (log.id == id) return &log;
  return nullptr;
}

const DtypeChoices* EngineModel::choices_for(const Version& version) const {
  for (const auto& entry : dtype_choices)
    if (entry.versions.contains(version)) return &entry;
  return nullptr;
}

const FallbackRule& EngineModel::fallback_for(const Version& version,
                                              const checkpoint::ModelFacts* model) const {
  if (model)
    for (const auto& rule : fallback_rules)
      if (rule.versions.contains(version) && !rule.when.empty() && rule.when.matches(*model))
        return rule;
  for (const auto& rule : fallback_rules)
    if (rule.versions.contains(version) && rule.when.empty()) return rule;
  throw InputError(file, "fallback: no rule covers " + version_text(version));  // lint forbids
}

const EngineDefaults& EngineModel::defaults_for(const Version& version) const {
  for (const auto& d : defaults)
    if (d.versions.contains(version)) return d;
  throw InputError(file, "defaults: no entry covers " + version_text(version));  // lint forbids
}

const MambaSlotRules* EngineModel::mamba_slots_for(const Version& version) const {
  for (const auto& rules : mamba_slots)
    if (rules.versions.contains(version)) return &rules;
  return nullptr;
}

std::vector<std::string> kv_cache_dtype_choices(const EngineModel& model, const Version& version) {
  std::vector<std::string> out;
  if (const DtypeChoices* choices = model.choices_for(version))
    for (const auto& c : choices->accepted) out.push_back(c.value);
  return out;
}

std::string cli_dtype(const EngineModel& model, const Version& version, std::string_view value) {
  if (const DtypeChoices* choices = model.choices_for(version))
    for (const auto& c : choices->accepted)
      if (c.value == value) return c.dtype;
  return "";
}

std::string cli_spelling(const EngineModel& model, const Version& version, std::string_view dtype) {
  if (const DtypeChoices* choices = model.choices_for(version))
    for (const auto& c : choices->accepted)
      if (c.dtype == dtype) return c.value;
  return "";
}

bool newer_than_known(const EngineModel& model, const Version& version) {
  if (version.latest) return false;
  auto latest = parse_version(model.latest_known_version);
  return latest && VersionRange{"", {{VersionRange::Op::gt, *latest}}}.contains(version);
}

}  // namespace kvaudit::engines
